//! A verify-only [`CryptoProvider`] for `jsonwebtoken` on `ring`, which the gateway already
//! builds for TLS: `jsonwebtoken`'s own backends are aws-lc-rs (needs cmake, slow to build) and
//! RustCrypto (about 35 more crates), and verifying RS256 and ES256 needs two `ring` calls.
//!
//! Only the two algorithms the gateway accepts are implemented; everything else, signing
//! included, is an error (never a panic), so a key or algorithm that slipped past the checks in
//! [`super::verify`] is still refused here.

use jsonwebtoken::crypto::{CryptoProvider, JwtVerifier, KeyUtils};
use jsonwebtoken::errors::{Error, ErrorKind};
use jsonwebtoken::signature::{self, Verifier};
use jsonwebtoken::{Algorithm, AlgorithmFamily, DecodingKey, DecodingKeyKind};
use ring::signature::{ECDSA_P256_SHA256_FIXED, RSA_PKCS1_2048_8192_SHA256, RsaPublicKeyComponents, UnparsedPublicKey};

/// RS256 and ES256 verification on `ring`; no signing, no JWK utilities.
static RING: CryptoProvider = CryptoProvider {
    signer_factory: |_, _| Err(unsupported()),
    verifier_factory: verifier,
    key_utils: KeyUtils {
        rsa_pub_components_from_private_key: |_| Err(unsupported()),
        rsa_pub_components_from_public_key: |_| Err(unsupported()),
        ec_pub_components_from_private_key: |_, _| Err(unsupported()),
        ed_pub_components_from_private_key: |_, _| Err(unsupported()),
        compute_digest: |_, _| Err(unsupported()),
    },
};

/// An RS256 public key: modulus and exponent, big-endian without leading zeros (as `ring` wants).
struct Rs256 {
    n: Vec<u8>,
    e: Vec<u8>,
}

/// An ES256 public key: the uncompressed P-256 point (`04 || x || y`).
struct Es256 {
    point: Vec<u8>,
}

/// Makes the `ring` provider `jsonwebtoken`'s process-wide one. Cheap after the first call.
///
/// `jsonwebtoken` picks its provider once per process (a `OnceLock`, so no race). It is built
/// here without a backend of its own and nothing else in the gateway installs one, so this is
/// the provider in force; were another installed first, that one would verify instead, and the
/// algorithm and key checks of [`super::verify`], which run before it, would still hold.
pub(super) fn install() {
    let _ = RING.install_default();
}

impl Verifier<Vec<u8>> for Rs256 {
    fn verify(&self, msg: &[u8], signature: &Vec<u8>) -> Result<(), signature::Error> {
        RsaPublicKeyComponents { n: &self.n, e: &self.e }
            .verify(&RSA_PKCS1_2048_8192_SHA256, msg, signature)
            .map_err(|_| signature::Error::new())
    }
}

impl JwtVerifier for Rs256 {
    fn algorithm(&self) -> Algorithm {
        Algorithm::RS256
    }
}

impl Verifier<Vec<u8>> for Es256 {
    fn verify(&self, msg: &[u8], signature: &Vec<u8>) -> Result<(), signature::Error> {
        UnparsedPublicKey::new(&ECDSA_P256_SHA256_FIXED, &self.point)
            .verify(msg, signature)
            .map_err(|_| signature::Error::new())
    }
}

impl JwtVerifier for Es256 {
    fn algorithm(&self) -> Algorithm {
        Algorithm::ES256
    }
}

fn verifier(algorithm: &Algorithm, key: &DecodingKey) -> Result<Box<dyn JwtVerifier>, Error> {
    match (algorithm, key.family(), key.kind()) {
        (Algorithm::RS256, AlgorithmFamily::Rsa, DecodingKeyKind::RsaModulusExponent { n, e }) => {
            Ok(Box::new(Rs256 { n: n.clone(), e: e.clone() }))
        }
        (Algorithm::ES256, AlgorithmFamily::Ec, DecodingKeyKind::SecretOrDer(point)) => {
            Ok(Box::new(Es256 { point: point.clone() }))
        }
        _ => Err(ErrorKind::InvalidAlgorithm.into()),
    }
}

fn unsupported() -> Error {
    ErrorKind::Provider("the gateway's ring provider only verifies RS256 and ES256".into()).into()
}
