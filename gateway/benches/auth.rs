//! What authentication costs per request: a static token looked up by its SHA-256 (among
//! 1,000), an unknown token, and JWTs verified with ES256 and RS256 (2048-bit), through
//! [`Authenticator::authenticate`] as the APIs call it.
//!
//! `cargo bench -p meridian-gateway --bench auth` (release); under `cargo test --bench '*'` one
//! short pass (see `common::quick`).

use std::hint::black_box;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use meridian_gateway::auth::tokens::sha256_hex;
use meridian_gateway::auth::{AuthConfig, Authenticator, JwtConfig};
use meridian_proto::duration::HumanDuration;
use ring::rand::SystemRandom;
use ring::signature::{
    ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair, RSA_PKCS1_SHA256, RsaKeyPair, RsaPublicKeyComponents,
};
use serde_json::json;

#[allow(dead_code)]
mod common;

type Result<T, E = Box<dyn std::error::Error>> = std::result::Result<T, E>;

const TOKENS: usize = 1_000;

fn main() -> Result<()> {
    let quick = common::quick();
    common::announce(quick);
    // How long each case runs.
    let run = if quick { Duration::from_millis(100) } else { Duration::from_secs(2) };
    let dir = tempfile::tempdir()?;
    let rng = SystemRandom::new();
    let mut tokens = String::from("tokens:\n");
    for i in 0..TOKENS {
        let token = format!("bench-token-{i:08}-abcdefgh");
        tokens.push_str(&format!(
            "  - {{subject: user{i}, role: member, tenants: [t{i}], sha256: {}}}\n",
            sha256_hex(&token)
        ));
    }
    std::fs::write(dir.path().join("tokens.yaml"), tokens)?;

    let ec_pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).map_err(|e| e.to_string())?;
    let ec = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, ec_pkcs8.as_ref(), &rng)
        .map_err(|e| e.to_string())?;
    let rsa_der = STANDARD.decode(include_str!("../src/auth/jwt/rsa-2048-test-key.b64").trim())?;
    let rsa = RsaKeyPair::from_der(&rsa_der).map_err(|e| e.to_string())?;
    let point = ec.public_key().as_ref();
    let components = RsaPublicKeyComponents::<Vec<u8>>::from(rsa.public());
    let jwks = json!({"keys": [
        {"kty": "EC", "crv": "P-256", "kid": "ec", "x": URL_SAFE_NO_PAD.encode(&point[1..33]), "y": URL_SAFE_NO_PAD.encode(&point[33..65])},
        {"kty": "RSA", "kid": "rsa", "n": URL_SAFE_NO_PAD.encode(&components.n), "e": URL_SAFE_NO_PAD.encode(&components.e)},
    ]});
    std::fs::write(dir.path().join("jwks.json"), jwks.to_string())?;

    let config = AuthConfig {
        tokens_file: Some(dir.path().join("tokens.yaml")),
        jwt: Some(JwtConfig {
            issuer: "https://idp.bench".into(),
            audience: "meridian".into(),
            jwks_file: dir.path().join("jwks.json"),
            leeway: HumanDuration::from_secs(60),
            subject_claim: "sub".into(),
            tenants_claim: "meridian_tenants".into(),
            role_claim: "meridian_role".into(),
        }),
        reload_interval: HumanDuration::from_secs(2),
    };
    let auth = Authenticator::from_config(Some(&config))?;
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
    let claims = json!({"iss": "https://idp.bench", "aud": "meridian", "sub": "svc", "exp": now + 3600,
                        "meridian_role": "member", "meridian_tenants": ["t1", "t2"]});
    let signed_input = |alg: &str, kid: &str| {
        let header = json!({"alg": alg, "kid": kid, "typ": "JWT"});
        format!("{}.{}", URL_SAFE_NO_PAD.encode(header.to_string()), URL_SAFE_NO_PAD.encode(claims.to_string()))
    };
    let es_input = signed_input("ES256", "ec");
    let es_signature = ec.sign(&rng, es_input.as_bytes()).map_err(|e| e.to_string())?;
    let es256 = format!("Bearer {es_input}.{}", URL_SAFE_NO_PAD.encode(es_signature.as_ref()));
    let rs_input = signed_input("RS256", "rsa");
    let mut rs_signature = vec![0; rsa.public().modulus_len()];
    rsa.sign(&RSA_PKCS1_SHA256, &rng, rs_input.as_bytes(), &mut rs_signature).map_err(|e| e.to_string())?;
    let rs256 = format!("Bearer {rs_input}.{}", URL_SAFE_NO_PAD.encode(&rs_signature));

    let cases: [(&str, String, bool); 4] = [
        ("static token (1 of 1,000)", format!("Bearer bench-token-{:08}-abcdefgh", TOKENS / 2), true),
        ("unknown static token", "Bearer no-such-token-0123456789".into(), false),
        ("JWT ES256", es256, true),
        ("JWT RS256 (2048-bit)", rs256, true),
    ];
    println!("{:<28} {:>12} {:>14}", "case", "µs/request", "requests/s");
    for (name, header, valid) in &cases {
        if auth.authenticate(Some(header)).is_ok() != *valid {
            return Err(format!("{name}: unexpected result").into());
        }
        let (mut calls, start) = (0u64, Instant::now());
        while start.elapsed() < run {
            for _ in 0..64 {
                let _ = black_box(auth.authenticate(Some(black_box(header.as_str()))));
            }
            calls += 64;
        }
        let secs = start.elapsed().as_secs_f64();
        let per = secs / calls as f64;
        println!("{name:<28} {:>12.2} {:>14.0}", per * 1e6, 1.0 / per);
    }
    Ok(())
}
