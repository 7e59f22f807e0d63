//! The public keys of a JSON Web Key Set file (`auth.jwt.jwksFile`), read with `jsonwebtoken`'s
//! JWK types, and the choice of the key that verifies a token.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, KeyAlgorithm};
use jsonwebtoken::{Algorithm, DecodingKey};
use serde_json::Value;

use super::JwtError;

/// Length of a P-256 coordinate (32 bytes) in unpadded base64url: a string of this length
/// decodes to exactly 32 bytes, so checking it checks the decoded size.
const P256_COORDINATE_B64_LEN: usize = 43;

/// The public keys of one version of the JWKS file.
#[derive(Debug, Clone, Default)]
pub struct KeySet {
    keys: Vec<Key>,
}

/// One usable public key.
#[derive(Debug, Clone)]
pub(super) struct Key {
    kid: Option<String>,
    /// RS256 or ES256: the only algorithm this key verifies.
    pub(super) algorithm: Algorithm,
    pub(super) decoding: DecodingKey,
}

impl KeySet {
    /// Parses JWKS JSON (`{"keys": [...]}`). Keys for other uses (`use` other than `sig`) or
    /// other algorithms are skipped; a malformed RSA or P-256 key, or a set with no usable key,
    /// is a problem (each named by index).
    pub fn parse(text: &str) -> Result<KeySet, Vec<String>> {
        let json: Value = serde_json::from_str(text).map_err(|e| vec![format!("not JSON: {e}")])?;
        let entries =
            json.get("keys").and_then(Value::as_array).ok_or_else(|| vec!["needs a `keys` array".to_owned()])?;
        let mut problems = Vec::new();
        let mut keys = Vec::new();
        for (i, entry) in entries.iter().enumerate() {
            match Key::from_entry(entry) {
                Ok(Some(key)) => keys.push(key),
                Ok(None) => {}
                Err(problem) => problems.push(format!("keys[{i}]{problem}")),
            }
        }
        if keys.is_empty() && problems.is_empty() {
            problems.push("holds no RS256 (RSA) or ES256 (EC P-256) signing key".into());
        }
        if problems.is_empty() { Ok(KeySet { keys }) } else { Err(problems) }
    }

    /// How many usable keys the set holds.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether the set holds no usable key.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The key for a token signed with `algorithm` that names `kid`: the key with that `kid` and
    /// algorithm, or without a `kid` the only key of that algorithm. An RS256 token never gets an
    /// EC key, nor the reverse, whatever its `kid` says.
    pub(super) fn find(&self, kid: Option<&str>, algorithm: Algorithm) -> Result<&Key, JwtError> {
        let alg_name = if algorithm == Algorithm::RS256 { "RS256" } else { "ES256" };
        let mut fitting = self.keys.iter().filter(|k| k.algorithm == algorithm);
        match kid {
            Some(kid) => fitting
                .find(|k| k.kid.as_deref() == Some(kid))
                .ok_or_else(|| JwtError::UnknownKey { kid: kid.to_owned(), alg: alg_name }),
            None => {
                let candidates: Vec<&Key> = fitting.collect();
                match candidates.as_slice() {
                    [only] => Ok(only),
                    other => Err(JwtError::NoKid(other.len(), alg_name)),
                }
            }
        }
    }
}

impl Key {
    /// The key of one JWKS entry; `None` for a key that is not for us (another use, algorithm or
    /// key type: skipped, not an error, so one JWKS can serve several relying parties). The
    /// error is the rest of a problem that starts with `keys[i]`.
    fn from_entry(entry: &Value) -> Result<Option<Key>, String> {
        // Foreign entries are told apart by their plain fields first, before the JWK types read
        // the whole entry: another party's key may carry fields (`x5c`, a numeric `kid`) those
        // types refuse, and it must be skipped, not fail the file.
        let text_of = |field: &str| entry.get(field).and_then(Value::as_str);
        let ours = match (text_of("kty"), text_of("alg")) {
            (Some("RSA"), None | Some("RS256")) => true,
            (Some("EC"), None | Some("ES256")) => text_of("crv") == Some("P-256"),
            _ => false,
        };
        if !ours || text_of("use").is_some_and(|u| u != "sig") {
            return Ok(None);
        }
        let jwk: Jwk = serde_json::from_value(entry.clone()).map_err(|e| format!(": not a JWK: {e}"))?;
        let kid = jwk.common.key_id.clone();
        // Some JWKS writers pad their base64url; `jsonwebtoken` reads it unpadded only.
        let unpadded = |text: &str| text.trim_end_matches('=').to_owned();
        let key = match (&jwk.algorithm, jwk.common.key_algorithm) {
            (AlgorithmParameters::RSA(rsa), None | Some(KeyAlgorithm::RS256)) => {
                let decode = |field: &str, text: &str| {
                    URL_SAFE_NO_PAD.decode(unpadded(text)).map_err(|e| format!(".{field}: not base64url: {e}"))
                };
                let (n, e) = (decode("n", &rsa.n)?, decode("e", &rsa.e)?);
                let (n, e) = (strip_leading_zeros(&n), strip_leading_zeros(&e));
                if n.len() * 8 < 2048 {
                    return Err(".n: RSA keys must have at least 2048 bits".into());
                }
                // `ring` wants the modulus and exponent without leading zeros.
                Key { kid, algorithm: Algorithm::RS256, decoding: DecodingKey::from_rsa_raw_components(n, e) }
            }
            (AlgorithmParameters::EllipticCurve(ec), None | Some(KeyAlgorithm::ES256))
                if ec.curve == EllipticCurve::P256 =>
            {
                let (x, y) = (unpadded(&ec.x), unpadded(&ec.y));
                if x.len() != P256_COORDINATE_B64_LEN || y.len() != P256_COORDINATE_B64_LEN {
                    return Err(": P-256 coordinates x and y must be 32 bytes each".into());
                }
                let decoding =
                    DecodingKey::from_ec_components(&x, &y).map_err(|e| format!(".x, .y: not base64url: {e}"))?;
                Key { kid, algorithm: Algorithm::ES256, decoding }
            }
            // An RSA or P-256 entry the JWK types could not read (a field missing or not a
            // string) is a broken key of ours, not a foreign one.
            (AlgorithmParameters::Other(other), None | Some(KeyAlgorithm::RS256 | KeyAlgorithm::ES256)) => {
                let text_of = |field: &str| other.fields.get(field).and_then(Value::as_str);
                return match (text_of("kty"), text_of("crv")) {
                    (Some("RSA"), _) => Err(": an RSA key needs the base64url strings `n` and `e`".into()),
                    (Some("EC"), Some("P-256")) => Err(": a P-256 key needs the base64url strings `x` and `y`".into()),
                    _ => Ok(None),
                };
            }
            _ => return Ok(None),
        };
        Ok(Some(key))
    }
}

fn strip_leading_zeros(bytes: &[u8]) -> &[u8] {
    let zeros = bytes.iter().take_while(|b| **b == 0).count();
    &bytes[zeros..]
}
