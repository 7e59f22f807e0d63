//! Building test tokens: a signer for ES256 (a fresh P-256 key) and RS256 (a fixed RSA key), and
//! the JWKS that holds their public keys. Used by the unit tests here and the API tests.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use ring::rand::SystemRandom;
use ring::signature::{
    ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair, RSA_PKCS1_SHA256, RsaKeyPair, RsaPublicKeyComponents,
};
use serde_json::{Value, json};

/// A 2048-bit RSA key (PKCS#1 DER, base64), made with `openssl genpkey` for tests and the
/// `auth` bench only.
const RSA_KEY: &str = include_str!("rsa-2048-test-key.b64");

/// A key that signs test tokens.
pub(crate) enum Signer {
    Es256(EcdsaKeyPair),
    Rs256(RsaKeyPair),
}

impl Signer {
    pub(crate) fn es256() -> Signer {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
        Signer::Es256(EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng).unwrap())
    }

    pub(crate) fn rs256() -> Signer {
        let der = STANDARD.decode(RSA_KEY.trim()).unwrap();
        Signer::Rs256(RsaKeyPair::from_der(&der).unwrap())
    }

    /// The public key as a JWK with `kid`.
    pub(crate) fn jwk(&self, kid: &str) -> Value {
        match self {
            Signer::Es256(pair) => {
                let point = pair.public_key().as_ref();
                json!({"kty": "EC", "crv": "P-256", "kid": kid, "use": "sig", "alg": "ES256",
                       "x": URL_SAFE_NO_PAD.encode(&point[1..33]), "y": URL_SAFE_NO_PAD.encode(&point[33..65])})
            }
            Signer::Rs256(pair) => {
                let components = RsaPublicKeyComponents::<Vec<u8>>::from(pair.public());
                json!({"kty": "RSA", "kid": kid, "alg": "RS256",
                       "n": URL_SAFE_NO_PAD.encode(&components.n), "e": URL_SAFE_NO_PAD.encode(&components.e)})
            }
        }
    }

    /// A signed token with `header` (its `alg` set here) and `claims`.
    pub(crate) fn sign(&self, mut header: Value, claims: &Value) -> String {
        header["alg"] = json!(match self {
            Signer::Es256(_) => "ES256",
            Signer::Rs256(_) => "RS256",
        });
        let signed =
            format!("{}.{}", URL_SAFE_NO_PAD.encode(header.to_string()), URL_SAFE_NO_PAD.encode(claims.to_string()));
        let rng = SystemRandom::new();
        let signature = match self {
            Signer::Es256(pair) => pair.sign(&rng, signed.as_bytes()).unwrap().as_ref().to_vec(),
            Signer::Rs256(pair) => {
                let mut signature = vec![0; pair.public().modulus_len()];
                pair.sign(&RSA_PKCS1_SHA256, &rng, signed.as_bytes(), &mut signature).unwrap();
                signature
            }
        };
        format!("{signed}.{}", URL_SAFE_NO_PAD.encode(signature))
    }
}

/// A JWKS document holding `keys`.
pub(crate) fn jwks(keys: &[Value]) -> String {
    json!({ "keys": keys }).to_string()
}
