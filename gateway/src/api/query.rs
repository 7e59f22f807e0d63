//! Decoding of a request's query string (`a=1&b=x%20y`) and of its path, strictly: bad
//! percent-encoding, text that is not UTF-8 and a repeated parameter are refused with a 400 that
//! names the parameter, rather than silently dropped as a lenient parser would.

use super::error::{ApiError, Result};

/// Decodes `raw` (the part of the URI after `?`, without it) into parameters in order.
/// `+` and `%20` are both a space; an empty segment (`a=1&&b=2`) is skipped; a name without `=`
/// has the empty value.
pub fn decode_query(raw: &str) -> Result<Vec<(String, String)>> {
    let mut params: Vec<(String, String)> = Vec::new();
    for segment in raw.split('&').filter(|s| !s.is_empty()) {
        let (raw_name, raw_value) = segment.split_once('=').unwrap_or((segment, ""));
        let name = decode_component(raw_name, true).map_err(|reason| ApiError::BadRequest {
            field: printable(raw_name),
            reason: format!("the parameter name {reason}"),
        })?;
        if name.is_empty() {
            return Err(ApiError::BadRequest {
                field: "query".into(),
                reason: format!("`{}` has no parameter name before its `=`", printable(segment)),
            });
        }
        let value = decode_component(raw_value, true)
            .map_err(|reason| ApiError::BadRequest { field: name.clone(), reason: format!("the value {reason}") })?;
        if params.iter().any(|(seen, _)| *seen == name) {
            return Err(ApiError::BadRequest {
                field: name,
                reason: "given more than once; give each query parameter once".into(),
            });
        }
        params.push((name, value));
    }
    Ok(params)
}

/// Checks that `path` is valid percent-encoded UTF-8, as the router's path parameters need.
pub fn check_path(path: &str) -> Result<()> {
    decode_component(path, false)
        .map(drop)
        .map_err(|reason| ApiError::BadRequest { field: "path".into(), reason: format!("the URL path {reason}") })
}

/// Percent-decodes one component; `plus_is_space` for query parts. The error says what is wrong
/// and where, as the end of a sentence.
fn decode_component(raw: &str, plus_is_space: bool) -> Result<String, String> {
    if !raw.contains(['%', '+']) {
        return Ok(raw.to_string());
    }
    let bytes = raw.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while let Some(&byte) = bytes.get(at) {
        match byte {
            b'%' => {
                let pair = bytes.get(at + 1..at + 3);
                let value = pair.and_then(|pair| Some(hex(pair[0])? << 4 | hex(pair[1])?));
                let Some(value) = value else {
                    let shown: String = raw[at..].chars().take(3).collect();
                    return Err(format!(
                        "has a bad percent-escape `{}` at byte {at}; write `%` as %25",
                        shown.escape_default()
                    ));
                };
                decoded.push(value);
                at += 3;
            }
            b'+' if plus_is_space => {
                decoded.push(b' ');
                at += 1;
            }
            other => {
                decoded.push(other);
                at += 1;
            }
        }
    }
    String::from_utf8(decoded).map_err(|e| {
        format!(
            "is not UTF-8 once decoded (invalid byte at {}); percent-encode UTF-8 text",
            e.utf8_error().valid_up_to()
        )
    })
}

fn hex(digit: u8) -> Option<u8> {
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        b'A'..=b'F' => Some(digit - b'A' + 10),
        _ => None,
    }
}

/// A raw name as it can be shown in an error: bounded and escaped.
fn printable(raw: &str) -> String {
    let mut shown: String = raw.chars().take(64).collect();
    if shown.len() < raw.len() {
        shown.push('…');
    }
    shown.escape_default().to_string()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use proptest::prelude::*;

    use super::*;

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn bad_field(raw: &str) -> String {
        match decode_query(raw) {
            Err(ApiError::BadRequest { field, .. }) => field,
            other => panic!("{raw}: expected a 400, got {other:?}"),
        }
    }

    #[test]
    fn plus_and_percent_twenty_are_spaces_and_escapes_decode() {
        let got = decode_query("selector=project%3Dllm%2C!draft&tenant=a+b&state=Queued%20x&flag").unwrap();
        assert_eq!(
            got,
            pairs(&[("selector", "project=llm,!draft"), ("tenant", "a b"), ("state", "Queued x"), ("flag", "")])
        );
        assert_eq!(decode_query("").unwrap(), vec![]);
        assert_eq!(decode_query("&&a=1&").unwrap(), pairs(&[("a", "1")]));
        assert_eq!(decode_query("a=%E2%9C%93").unwrap(), pairs(&[("a", "✓")]));
        assert_eq!(decode_query("a=b=c").unwrap(), pairs(&[("a", "b=c")]));
    }

    #[test]
    fn bad_encoding_is_refused_naming_the_parameter() {
        assert_eq!(bad_field("tenant=%ff"), "tenant");
        assert_eq!(bad_field("limit=5&state=%zz"), "state");
        assert_eq!(bad_field("state=abc%"), "state");
        assert_eq!(bad_field("state=abc%4"), "state");
        assert_eq!(bad_field("st%ffate=1"), "st%ffate");
        assert_eq!(bad_field("a=%C3%28"), "a");
    }

    #[test]
    fn a_parameter_without_a_name_is_refused_naming_the_query() {
        // Found by the `rest_query` fuzz target: `=tea` decoded to an empty name, and the list
        // parameters then refused it naming an empty field.
        assert_eq!(bad_field("=tea"), "query");
        assert_eq!(bad_field("limit=1&="), "query");
    }

    #[test]
    fn a_repeated_parameter_is_refused_naming_it() {
        assert_eq!(bad_field("state=Queued&limit=1&state=Running"), "state");
        // The same name spelled two ways is still the same parameter.
        assert_eq!(bad_field("state=1&%73tate=2"), "state");
    }

    #[test]
    fn a_path_with_bad_encoding_is_refused() {
        assert!(check_path("/v1/jobs/j-1%2Fx").is_ok());
        assert!(check_path("/v1/jobs/a+b").is_ok());
        match check_path("/v1/jobs/%ff") {
            Err(ApiError::BadRequest { field, reason }) => {
                assert_eq!(field, "path");
                assert!(reason.contains("UTF-8"), "{reason}");
            }
            other => panic!("expected a 400, got {other:?}"),
        }
        assert!(check_path("/v1/jobs/%g1").is_err());
    }

    proptest! {
        #[test]
        fn encoded_parameters_come_back_as_given(
            params in proptest::collection::btree_map("[^\u{0}]{1,8}", ".{0,12}", 0..6),
        ) {
            let encode = |text: &str| {
                text.bytes().map(|b| if b.is_ascii_alphanumeric() { (b as char).to_string() } else { format!("%{b:02X}") }).collect::<String>()
            };
            let raw: Vec<String> = params.iter().map(|(k, v)| format!("{}={}", encode(k), encode(v))).collect();
            let decoded = decode_query(&raw.join("&")).unwrap();
            let expected: Vec<(String, String)> = params.into_iter().collect();
            prop_assert_eq!(decoded, expected);
        }

        #[test]
        fn any_text_decodes_or_is_refused_without_panicking(raw in ".{0,64}") {
            let _ = decode_query(&raw);
            let _ = check_path(&raw);
        }
    }
}
