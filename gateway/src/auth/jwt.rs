//! JSON Web Tokens signed with RS256 or ES256, verified with the `jsonwebtoken` crate (its
//! signature checks on `ring`, in `jwt/ring_provider.rs`) against the public keys of a JSON Web
//! Key Set file (`auth.jwt.jwksFile`).
//!
//! Checked: the algorithm (RS256 or ES256 only: `none` and the shared-secret HS* algorithms are
//! refused), the key (`kid`), the signature, `exp` (required), `nbf`, `iss`, `aud`, and the
//! subject, role and tenants claims.
//!
//! `jsonwebtoken` splits and decodes the token, checks the signature and `aud`. The checks it
//! does not make, or makes with a different answer, stay here: the algorithm allow-list and
//! `crit` (with the refused `alg` in the error), the key choice by `kid`, `exp` and `nbf` against
//! the caller's clock (the crate reads the system clock and cannot be given `now`), `iss` (the
//! crate also accepts a list), and the claims that name the caller.

mod keys;
mod ring_provider;

use std::collections::{BTreeSet, HashSet};
use std::path::Path;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, Validation};
use serde_json::{Map, Value};

pub use self::keys::KeySet;
use super::{Caller, LoadError, Role};

/// Longest token accepted (a guard against huge headers being decoded).
pub const MAX_TOKEN_LEN: usize = 16 * 1024;

/// What a token must satisfy (from `auth.jwt`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JwtSettings {
    /// Required `iss`.
    pub issuer: String,
    /// A value `aud` must hold.
    pub audience: String,
    /// Clock skew allowed on `exp` and `nbf`, in seconds.
    pub leeway_secs: i64,
    /// The claim that names the caller.
    pub subject_claim: String,
    /// The claim with the tenants.
    pub tenants_claim: String,
    /// The claim with the role.
    pub role_claim: String,
}

/// Why a JWT was refused. Messages name the check that failed, never the token.
#[derive(Debug, thiserror::Error)]
pub enum JwtError {
    /// Not three base64url segments of JSON.
    #[error("malformed: {0}")]
    Malformed(String),
    /// `alg` is `none`, HS*, or another algorithm not accepted.
    #[error("algorithm `{0}` is not accepted; tokens must be signed with RS256 or ES256")]
    Algorithm(String),
    /// The header has a `crit` extension this gateway does not understand.
    #[error("the header lists critical extensions (`crit`) this gateway does not support")]
    Critical,
    /// No key in the key set has the token's `kid` (and algorithm).
    #[error("no {alg} key with kid `{kid}` in the key set (was the key rotated? the gateway rereads jwksFile)")]
    UnknownKey {
        /// The token's `kid`.
        kid: String,
        /// The token's algorithm.
        alg: &'static str,
    },
    /// The token names no `kid` and the key set has more than one candidate key.
    #[error("the header has no `kid` and the key set holds {0} {1} keys; the issuer must set kid")]
    NoKid(usize, &'static str),
    /// The signature does not verify with the key.
    #[error("the signature does not verify")]
    Signature,
    /// `exp` is in the past (beyond the leeway).
    #[error("expired at {exp} (now {now}, Unix seconds)")]
    Expired {
        /// The token's `exp`.
        exp: i64,
        /// The gateway's clock.
        now: i64,
    },
    /// `nbf` is in the future (beyond the leeway).
    #[error("not valid before {nbf} (now {now}, Unix seconds)")]
    NotYetValid {
        /// The token's `nbf`.
        nbf: i64,
        /// The gateway's clock.
        now: i64,
    },
    /// `iss` is not the configured issuer.
    #[error("issuer `{found}` is not the configured `{expected}`")]
    Issuer {
        /// The token's `iss`.
        found: String,
        /// `auth.jwt.issuer`.
        expected: String,
    },
    /// `aud` does not hold the configured audience.
    #[error("audience does not include `{expected}`")]
    Audience {
        /// `auth.jwt.audience`.
        expected: String,
    },
    /// A claim is missing or of the wrong type.
    #[error("claim `{claim}`: {reason}")]
    Claim {
        /// The claim.
        claim: String,
        /// What is wrong.
        reason: String,
    },
}

/// Whether `token` has the shape of a JWS compact token (three dot-separated segments).
pub fn looks_like_jwt(token: &str) -> bool {
    token.split('.').count() == 3
}

/// Verifies `token` at `now` (Unix seconds) and returns its caller.
pub fn verify(token: &str, keys: &KeySet, settings: &JwtSettings, now: i64) -> Result<Caller, JwtError> {
    if token.len() > MAX_TOKEN_LEN {
        return Err(JwtError::Malformed(format!("longer than {MAX_TOKEN_LEN} bytes")));
    }
    let mut segments = token.split('.');
    let (Some(header_b64), Some(_), Some(_), None) =
        (segments.next(), segments.next(), segments.next(), segments.next())
    else {
        return Err(JwtError::Malformed("a JWT has three dot-separated segments".into()));
    };
    // Read here first, before `jsonwebtoken` reads it again: its header type has no place for an
    // algorithm it does not know (`none`), and the error names the algorithm refused.
    let header = decode_json(header_b64, "header")?;
    let algorithm = match header.get("alg").and_then(Value::as_str).unwrap_or("") {
        "RS256" => Algorithm::RS256,
        "ES256" => Algorithm::ES256,
        other => return Err(JwtError::Algorithm(other.to_owned())),
    };
    // `jsonwebtoken` understands `crit: ["b64"]`; this gateway understands none.
    if header.contains_key("crit") {
        return Err(JwtError::Critical);
    }
    let kid = match header.get("kid") {
        None => None,
        Some(Value::String(kid)) => Some(kid.as_str()),
        Some(_) => return Err(JwtError::Malformed("header `kid` must be a string".into())),
    };
    let key = keys.find(kid, algorithm)?;

    ring_provider::install();
    let claims = jsonwebtoken::decode::<Map<String, Value>>(token, &key.decoding, &validation(key.algorithm, settings))
        .map_err(|e| crate_error(e, settings))?
        .claims;
    check_times(&claims, settings.leeway_secs, now)?;
    let issuer = claims.get("iss").and_then(Value::as_str).unwrap_or("");
    if issuer != settings.issuer {
        return Err(JwtError::Issuer { found: issuer.to_owned(), expected: settings.issuer.clone() });
    }
    caller_of(&claims, settings)
}

/// Reads and parses a JWKS file.
pub fn load_jwks(path: &Path) -> Result<KeySet, LoadError> {
    let text = std::fs::read_to_string(path).map_err(|source| LoadError::Read { path: path.to_path_buf(), source })?;
    KeySet::parse(&text).map_err(|problems| LoadError::Invalid { path: path.to_path_buf(), problems })
}

/// What `jsonwebtoken` checks: the signature with `algorithm` only, and that `aud` is present
/// and holds the audience. Its time checks are off (done by [`check_times`] against the
/// caller's clock), and its default required `exp` is replaced by `aud` (`exp` is required by
/// [`check_times`]; without `aud` required, a token with no `aud` would pass).
fn validation(algorithm: Algorithm, settings: &JwtSettings) -> Validation {
    let mut validation = Validation::new(algorithm);
    validation.validate_exp = false;
    validation.validate_nbf = false;
    validation.validate_aud = true;
    validation.aud = Some(HashSet::from([settings.audience.clone()]));
    validation.required_spec_claims = HashSet::from(["aud".to_owned()]);
    validation
}

/// Our error for one of `jsonwebtoken`'s. The algorithm, `crit` and key have been checked
/// before, and its only claim check is `aud`, so what is left is the signature, the audience
/// or a malformed token.
fn crate_error(error: jsonwebtoken::errors::Error, settings: &JwtSettings) -> JwtError {
    match error.kind() {
        ErrorKind::InvalidSignature => JwtError::Signature,
        ErrorKind::InvalidAudience => JwtError::Audience { expected: settings.audience.clone() },
        ErrorKind::MissingRequiredClaim(claim) | ErrorKind::InvalidClaimFormat(claim) if claim == "aud" => {
            JwtError::Audience { expected: settings.audience.clone() }
        }
        ErrorKind::Base64(e) => JwtError::Malformed(format!("not base64url: {e}")),
        ErrorKind::Json(e) => JwtError::Malformed(format!("header or payload is not a JSON object: {e}")),
        _ => JwtError::Malformed(error.to_string()),
    }
}

fn decode_json(segment: &str, what: &str) -> Result<Map<String, Value>, JwtError> {
    let bytes =
        URL_SAFE_NO_PAD.decode(segment).map_err(|e| JwtError::Malformed(format!("{what} is not base64url: {e}")))?;
    match serde_json::from_slice(&bytes) {
        Ok(Value::Object(object)) => Ok(object),
        Ok(_) => Err(JwtError::Malformed(format!("{what} is not a JSON object"))),
        Err(e) => Err(JwtError::Malformed(format!("{what} is not JSON: {e}"))),
    }
}

fn check_times(claims: &Map<String, Value>, leeway: i64, now: i64) -> Result<(), JwtError> {
    let time_of = |claim: &str| -> Result<Option<i64>, JwtError> {
        match claims.get(claim) {
            None => Ok(None),
            Some(value) => value.as_f64().filter(|v| v.is_finite()).map(|v| Some(v as i64)).ok_or_else(|| {
                JwtError::Claim { claim: claim.into(), reason: "must be a number of seconds since the epoch".into() }
            }),
        }
    };
    let exp = time_of("exp")?
        .ok_or_else(|| JwtError::Claim { claim: "exp".into(), reason: "required: tokens must expire".into() })?;
    if now > exp.saturating_add(leeway) {
        return Err(JwtError::Expired { exp, now });
    }
    if let Some(nbf) = time_of("nbf")?
        && now.saturating_add(leeway) < nbf
    {
        return Err(JwtError::NotYetValid { nbf, now });
    }
    Ok(())
}

fn caller_of(claims: &Map<String, Value>, settings: &JwtSettings) -> Result<Caller, JwtError> {
    let claim_error = |claim: &str, reason: &str| JwtError::Claim { claim: claim.into(), reason: reason.into() };
    let subject = claims
        .get(&settings.subject_claim)
        .and_then(Value::as_str)
        .filter(|s| !s.trim().is_empty())
        .ok_or_else(|| claim_error(&settings.subject_claim, "required: a non-empty string naming the caller"))?;
    let role = claims
        .get(&settings.role_claim)
        .and_then(Value::as_str)
        .ok_or_else(|| claim_error(&settings.role_claim, "required: `admin`, `member` or `viewer`"))?
        .parse::<Role>()
        .map_err(|reason| claim_error(&settings.role_claim, &reason))?;
    let tenants: BTreeSet<String> =
        match claims.get(&settings.tenants_claim) {
            None => BTreeSet::new(),
            Some(Value::String(one)) => [one.clone()].into(),
            Some(Value::Array(items)) => items
                .iter()
                .map(|item| item.as_str().map(str::to_owned))
                .collect::<Option<_>>()
                .ok_or_else(|| claim_error(&settings.tenants_claim, "must be a list of tenant names"))?,
            Some(_) => return Err(claim_error(&settings.tenants_claim, "must be a list of tenant names")),
        };
    if role != Role::Admin && tenants.is_empty() {
        return Err(claim_error(&settings.tenants_claim, &format!("a {role} needs at least one tenant")));
    }
    Ok(Caller { subject: subject.to_owned(), role, tenants })
}

#[cfg(test)]
pub(crate) mod testing;

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use serde_json::json;

    use super::testing::{Signer, jwks};
    use super::*;

    const NOW: i64 = 1_800_000_000;

    fn settings() -> JwtSettings {
        JwtSettings {
            issuer: "https://idp.example".into(),
            audience: "meridian".into(),
            leeway_secs: 60,
            subject_claim: "sub".into(),
            tenants_claim: "meridian_tenants".into(),
            role_claim: "meridian_role".into(),
        }
    }

    fn claims() -> Value {
        json!({"iss": "https://idp.example", "aud": "meridian", "sub": "alice", "exp": NOW + 600,
               "nbf": NOW - 10, "meridian_role": "member", "meridian_tenants": ["vision"]})
    }

    fn with(mut value: Value, key: &str, new: Value) -> Value {
        value[key] = new;
        value
    }

    fn setup() -> (Signer, KeySet) {
        let signer = Signer::es256();
        let keys = KeySet::parse(&jwks(&[signer.jwk("k1")])).unwrap();
        (signer, keys)
    }

    fn check(token: &str, keys: &KeySet) -> Result<Caller, JwtError> {
        verify(token, keys, &settings(), NOW)
    }

    #[test]
    fn a_valid_es256_token_names_its_caller() {
        let (signer, keys) = setup();
        let caller = check(&signer.sign(json!({"kid": "k1", "typ": "JWT"}), &claims()), &keys).unwrap();
        assert_eq!(caller.subject, "alice");
        assert_eq!(caller.role, Role::Member);
        assert_eq!(caller.tenants, ["vision".to_string()].into());
    }

    #[test]
    fn a_valid_rs256_token_verifies_and_an_audience_list_is_searched() {
        let signer = Signer::rs256();
        let keys = KeySet::parse(&jwks(&[Signer::es256().jwk("ec"), signer.jwk("rsa")])).unwrap();
        let claims = with(claims(), "aud", json!(["other", "meridian"]));
        let caller = check(&signer.sign(json!({"kid": "rsa"}), &claims), &keys).unwrap();
        assert_eq!(caller.subject, "alice");
    }

    #[test]
    fn an_expired_token_is_refused_after_the_leeway() {
        let (signer, keys) = setup();
        let within_leeway = signer.sign(json!({"kid": "k1"}), &with(claims(), "exp", json!(NOW - 30)));
        assert!(check(&within_leeway, &keys).is_ok());
        let expired = signer.sign(json!({"kid": "k1"}), &with(claims(), "exp", json!(NOW - 61)));
        assert!(matches!(check(&expired, &keys), Err(JwtError::Expired { .. })));
        let mut no_exp = claims();
        no_exp.as_object_mut().unwrap().remove("exp");
        let err = check(&signer.sign(json!({"kid": "k1"}), &no_exp), &keys).unwrap_err();
        assert!(err.to_string().contains("exp"), "{err}");
    }

    #[test]
    fn a_token_not_yet_valid_is_refused() {
        let (signer, keys) = setup();
        let early = signer.sign(json!({"kid": "k1"}), &with(claims(), "nbf", json!(NOW + 120)));
        assert!(matches!(check(&early, &keys), Err(JwtError::NotYetValid { .. })));
    }

    #[test]
    fn the_wrong_issuer_or_audience_is_refused() {
        let (signer, keys) = setup();
        let issuer = signer.sign(json!({"kid": "k1"}), &with(claims(), "iss", json!("https://evil.example")));
        assert!(matches!(check(&issuer, &keys), Err(JwtError::Issuer { .. })));
        let audience = signer.sign(json!({"kid": "k1"}), &with(claims(), "aud", json!("someone-else")));
        assert!(matches!(check(&audience, &keys), Err(JwtError::Audience { .. })));
    }

    #[test]
    fn an_unknown_kid_is_refused() {
        let (signer, keys) = setup();
        let token = signer.sign(json!({"kid": "k2"}), &claims());
        let err = check(&token, &keys).unwrap_err();
        assert!(matches!(err, JwtError::UnknownKey { .. }), "{err}");
    }

    #[test]
    fn a_missing_kid_is_fine_with_one_key_only() {
        let (signer, keys) = setup();
        let token = signer.sign(json!({}), &claims());
        assert!(check(&token, &keys).is_ok());
        let two = KeySet::parse(&jwks(&[signer.jwk("k1"), Signer::es256().jwk("k2")])).unwrap();
        assert!(matches!(check(&token, &two), Err(JwtError::NoKid(2, "ES256"))));
    }

    #[test]
    fn a_signature_by_another_key_or_over_changed_claims_is_refused() {
        let (_, keys) = setup();
        let impostor = Signer::es256().sign(json!({"kid": "k1"}), &claims());
        assert!(matches!(check(&impostor, &keys), Err(JwtError::Signature)));

        let (signer, keys) = setup();
        let token = signer.sign(json!({"kid": "k1"}), &claims());
        let mut parts: Vec<&str> = token.split('.').collect();
        let admin = URL_SAFE_NO_PAD.encode(with(claims(), "meridian_role", json!("admin")).to_string());
        parts[1] = &admin;
        assert!(matches!(check(&parts.join("."), &keys), Err(JwtError::Signature)));
    }

    #[test]
    fn alg_none_and_hs256_are_refused() {
        let (_, keys) = setup();
        let body = URL_SAFE_NO_PAD.encode(claims().to_string());
        for alg in ["none", "HS256", "HS512", "PS256"] {
            let header = URL_SAFE_NO_PAD.encode(json!({"alg": alg, "kid": "k1"}).to_string());
            for token in [format!("{header}.{body}."), format!("{header}.{body}.c2lnbmF0dXJl")] {
                let err = check(&token, &keys).unwrap_err();
                assert!(matches!(err, JwtError::Algorithm(ref a) if a == alg), "{alg}: {err}");
            }
        }
    }

    #[test]
    fn an_es256_key_does_not_verify_an_rs256_token() {
        // Algorithm confusion: the token says RS256 but names the EC key's kid.
        let (_, keys) = setup();
        let token = Signer::rs256().sign(json!({"kid": "k1"}), &claims());
        assert!(matches!(check(&token, &keys), Err(JwtError::UnknownKey { alg: "RS256", .. })));
    }

    #[test]
    fn role_and_tenant_claims_are_required_and_checked() {
        let (signer, keys) = setup();
        let sign = |claims: Value| signer.sign(json!({"kid": "k1"}), &claims);
        let no_role = {
            let mut c = claims();
            c.as_object_mut().unwrap().remove("meridian_role");
            c
        };
        assert!(check(&sign(no_role), &keys).unwrap_err().to_string().contains("meridian_role"));
        let bad_role = with(claims(), "meridian_role", json!("root"));
        assert!(check(&sign(bad_role), &keys).unwrap_err().to_string().contains("meridian_role"));
        let no_tenants = with(claims(), "meridian_tenants", json!([]));
        assert!(check(&sign(no_tenants), &keys).unwrap_err().to_string().contains("meridian_tenants"));
        let one_tenant = with(claims(), "meridian_tenants", json!("nlp"));
        assert_eq!(check(&sign(one_tenant), &keys).unwrap().tenants, ["nlp".to_string()].into());
        let admin = with(with(claims(), "meridian_role", json!("admin")), "meridian_tenants", json!([]));
        assert_eq!(check(&sign(admin), &keys).unwrap().role, Role::Admin);
    }

    #[test]
    fn malformed_tokens_are_refused_without_panicking() {
        let (_, keys) = setup();
        for token in ["", "a", "a.b", "a.b.c", "a.b.c.d", "e30.e30.e30", "W10.e30.", "!!!.e30."] {
            assert!(check(token, &keys).is_err(), "{token}");
        }
    }

    #[test]
    fn the_crate_defaults_do_not_loosen_the_checks() {
        let (signer, keys) = setup();
        let sign = |claims: Value| signer.sign(json!({"kid": "k1"}), &claims);
        let mut no_aud = claims();
        no_aud.as_object_mut().unwrap().remove("aud");
        assert!(matches!(check(&sign(no_aud), &keys), Err(JwtError::Audience { .. })));
        let aud_null = with(claims(), "aud", Value::Null);
        assert!(matches!(check(&sign(aud_null), &keys), Err(JwtError::Audience { .. })));
        let issuer_list = with(claims(), "iss", json!(["https://idp.example"]));
        assert!(matches!(check(&sign(issuer_list), &keys), Err(JwtError::Issuer { .. })));
        let b64_crit = signer.sign(json!({"kid": "k1", "b64": true, "crit": ["b64"]}), &claims());
        assert!(matches!(check(&b64_crit, &keys), Err(JwtError::Critical)));
        // Times are checked against the `now` given, not the system clock.
        let long_ago = with(with(claims(), "exp", json!(1_000_000_100)), "nbf", json!(1_000_000_000));
        assert!(verify(&sign(long_ago.clone()), &keys, &settings(), 1_000_000_000).is_ok());
        assert!(matches!(check(&sign(long_ago), &keys), Err(JwtError::Expired { .. })));
        let float_exp = with(claims(), "exp", json!((NOW + 600) as f64 + 0.5));
        assert!(check(&sign(float_exp), &keys).is_ok());
        let string_exp = with(claims(), "exp", json!("soon"));
        assert!(check(&sign(string_exp), &keys).unwrap_err().to_string().contains("exp"));
    }

    #[test]
    fn padded_jwk_coordinates_are_read_and_broken_keys_of_ours_are_named() {
        let pad = |jwk: &mut Value, field: &str| {
            let text = jwk[field].as_str().unwrap().to_owned();
            jwk[field] = json!(format!("{text}{}", "=".repeat((4 - text.len() % 4) % 4)));
        };
        let (rsa, ec) = (Signer::rs256(), Signer::es256());
        let (mut rsa_jwk, mut ec_jwk) = (rsa.jwk("rsa"), ec.jwk("ec"));
        pad(&mut rsa_jwk, "n");
        pad(&mut ec_jwk, "x");
        pad(&mut ec_jwk, "y");
        assert!(rsa_jwk["n"].as_str().unwrap().ends_with('=') && ec_jwk["x"].as_str().unwrap().ends_with('='));
        let keys = KeySet::parse(&jwks(&[rsa_jwk, ec_jwk])).unwrap();
        assert!(check(&rsa.sign(json!({"kid": "rsa"}), &claims()), &keys).is_ok());
        assert!(check(&ec.sign(json!({"kid": "ec"}), &claims()), &keys).is_ok());
        let err = KeySet::parse(r#"{"keys": [{"kty": "RSA", "kid": "a", "e": "AQAB"}]}"#).unwrap_err();
        assert!(err[0].starts_with("keys[0]") && err[0].contains("`n`"), "{err:?}");
        let err = KeySet::parse(r#"{"keys": [{"kty": "EC", "crv": "P-256", "x": "AA"}]}"#).unwrap_err();
        assert!(err[0].starts_with("keys[0]") && err[0].contains("`y`"), "{err:?}");
        let foreign = jwks(&[json!({"kty": "EC", "crv": "secp256k1", "x": "AA"}), Signer::es256().jwk("k")]);
        assert_eq!(KeySet::parse(&foreign).unwrap().len(), 1);
        // Another party's entry with fields the JWK types refuse is skipped, not a broken file.
        let odd = json!({"kty": "OKP", "crv": "Ed25519", "kid": 7, "x5c": "x", "x": "AA"});
        assert_eq!(KeySet::parse(&jwks(&[odd, Signer::es256().jwk("k")])).unwrap().len(), 1);
        let other_use = json!({"kty": "RSA", "use": "enc", "kid": ["a"], "n": "AQAB", "e": "AQAB"});
        assert_eq!(KeySet::parse(&jwks(&[other_use, Signer::es256().jwk("k")])).unwrap().len(), 1);
    }

    #[test]
    fn jwks_problems_are_named_and_foreign_keys_skipped() {
        let err = KeySet::parse(r#"{"keys": [{"kty": "EC", "crv": "P-256", "x": "AA", "y": "AA"}]}"#).unwrap_err();
        assert!(err[0].contains("keys[0]") && err[0].contains("32 bytes"), "{err:?}");
        let err = KeySet::parse(r#"{"keys": [{"kty": "RSA", "n": "AQAB", "e": "AQAB"}]}"#).unwrap_err();
        assert!(err[0].contains("2048"), "{err:?}");
        let err = KeySet::parse(r#"{"keys": [{"kty": "oct", "k": "c2VjcmV0"}]}"#).unwrap_err();
        assert!(err[0].contains("no RS256"), "{err:?}");
        let mixed = jwks(&[json!({"kty": "oct", "k": "c2VjcmV0"}), Signer::es256().jwk("k")]);
        assert_eq!(KeySet::parse(&mixed).unwrap().len(), 1);
        assert!(KeySet::parse("[]").is_err());
    }
}
