//! The agent's `gateway:` field: one gRPC address, or several (the gateways of a highly
//! available control plane, of which one leads). It is read from a YAML string or sequence, kept
//! as comma-separated text (so `--gateway a,b` and code that sets one address keep working), and
//! split with [`split`].

use serde::de::{self, SeqAccess, Visitor};
use serde::{Deserializer, Serializer};

use super::TlsFiles;

/// The addresses in `text` (comma-separated), trimmed, in order. An empty text is one empty
/// address, so that the check names it.
pub(crate) fn split(text: &str) -> Vec<String> {
    text.split(',').map(|address| address.trim().to_string()).collect()
}

/// Reads `gateway:` from a string (`https://gw:7071`, also `https://gw-1:7071,https://gw-2:7071`)
/// or a sequence of strings, into comma-separated text.
pub(super) fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    struct Addresses;

    impl<'de> Visitor<'de> for Addresses {
        type Value = String;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a gateway address (https://HOST:PORT) or a list of them")
        }

        fn visit_str<E: de::Error>(self, value: &str) -> Result<String, E> {
            Ok(value.to_string())
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<String, A::Error> {
            let mut addresses = Vec::new();
            while let Some(address) = seq.next_element::<String>()? {
                addresses.push(address);
            }
            Ok(addresses.join(","))
        }
    }

    deserializer.deserialize_any(Addresses)
}

/// Writes `gateway:` back as a string when it holds one address, as a sequence otherwise.
pub(super) fn serialize<S: Serializer>(text: &str, serializer: S) -> Result<S::Ok, S::Error> {
    let addresses = split(text);
    match addresses.as_slice() {
        [one] => serializer.serialize_str(one),
        several => serializer.collect_seq(several),
    }
}

/// Checks every address and its agreement with `tls` and `insecure`: https with `tls`, http only
/// with `insecure`. One address is named `gateway`, several `gateway[i]`.
pub(super) fn check(
    addresses: &[String],
    tls: Option<&TlsFiles>,
    insecure: bool,
    cluster: &str,
    problems: &mut Vec<String>,
) {
    let name = |i: usize| if addresses.len() == 1 { "gateway".to_string() } else { format!("gateway[{i}]") };
    let mut first_https = None;
    for (i, address) in addresses.iter().enumerate() {
        let https = address.starts_with("https://");
        if !(https || address.starts_with("http://")) {
            let problem = if address.is_empty() {
                format!("{}: must name a gateway's gRPC address, such as https://gw.example.com:7071", name(i))
            } else {
                format!("{}: `{address}` must start with https:// (or http:// with insecure: true)", name(i))
            };
            problems.push(problem);
            continue;
        }
        if let Err(reason) = check_authority(address) {
            problems.push(format!("{}: `{address}` {reason}; write SCHEME://HOST:PORT", name(i)));
            continue;
        }
        if https {
            first_https.get_or_insert(address);
            continue;
        }
        match (tls, insecure) {
            (None, true) => {}
            (None, false) => problems.push(format!(
                "{}: `{address}` is plain text; use https:// with a `tls` section, or set `insecure: true` to speak plain text",
                name(i)
            )),
            (Some(_), _) => {
                problems.push(format!("{}: `{address}` is http:// but the `tls` section is set; use https://", name(i)))
            }
        }
    }
    let Some(https) = first_https else { return };
    match (tls, insecure) {
        (Some(tls), false) => {
            for (field, path) in [("ca", &tls.ca), ("cert", &tls.cert), ("key", &tls.key)] {
                if path.as_os_str().is_empty() {
                    problems.push(format!("tls.{field}: must name a PEM file"));
                }
            }
        }
        (None, _) => problems.push(format!(
            "tls: the gateway `{https}` is https; set `tls: {{ca, cert, key}}` (`meridian certs issue --cluster {cluster}` makes the certificate)"
        )),
        (Some(_), true) => problems.push("insecure: true contradicts the `tls` section; remove one of them".to_string()),
    }
}

/// Whether `address` (with an http or https scheme) names a host, and nothing but a host and port.
fn check_authority(address: &str) -> Result<(), String> {
    let uri: tonic::transport::Uri = address.parse().map_err(|e| format!("is not a valid address ({e})"))?;
    match uri.authority() {
        Some(authority) if !authority.host().is_empty() => {}
        _ => return Err("names no host".to_string()),
    }
    if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
        return Err("has a path; the gateway's gRPC address is only a host and port".to_string());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::config::{AgentConfig, Error};

    const BASE: &str = "cluster: east\nregion: us-east\nrunner: simulated\nnodes:\n  - {shape: dgx, count: 1, gpuType: h100, gpus: 8, cpu: 96, memoryGiB: 1024}\n";
    const TLS: &str = "tls: {ca: ca.pem, cert: east.pem, key: east.key}\n";

    fn parse(extra: &str) -> crate::config::Result<AgentConfig> {
        AgentConfig::parse(&format!("{BASE}{extra}"), Path::new("a.yaml"))
    }

    fn problems(extra: &str) -> Vec<String> {
        match parse(extra) {
            Err(Error::Invalid { problems, .. }) => problems,
            other => panic!("expected invalid, got {other:?}"),
        }
    }

    #[test]
    fn one_address_is_still_a_string() {
        let config = parse(&format!("gateway: https://gw:7071\n{TLS}")).unwrap();
        assert_eq!(config.gateway, "https://gw:7071");
        assert_eq!(config.gateways(), ["https://gw:7071"]);
    }

    #[test]
    fn several_addresses_come_as_a_list_in_order() {
        let config = parse(&format!("gateway: [https://gw-1:7071, https://gw-2:7071]\n{TLS}")).unwrap();
        assert_eq!(config.gateways(), ["https://gw-1:7071", "https://gw-2:7071"]);
        let block = parse(&format!("gateway:\n  - https://gw-2:7071\n  - https://gw-1:7071\n{TLS}")).unwrap();
        assert_eq!(block.gateways(), ["https://gw-2:7071", "https://gw-1:7071"]);
    }

    #[test]
    fn the_flag_takes_a_comma_separated_list() {
        // `--gateway` overwrites the field with the flag's text, then the config is checked.
        let text = format!("{BASE}insecure: true\n");
        let mut config: AgentConfig = meridian_proto::config_file::parse_yaml(&text, Path::new("a.yaml")).unwrap();
        config.gateway = "http://gw-1:7071, http://gw-2:7071".into();
        config.check(Path::new("a.yaml")).unwrap();
        assert_eq!(config.gateways(), ["http://gw-1:7071", "http://gw-2:7071"]);
    }

    #[test]
    fn a_bad_entry_is_named_by_its_index() {
        let found = problems(&format!("gateway: [https://gw-1:7071, 'gw-2:7071', http://gw-3:7071, '']\n{TLS}"));
        assert_eq!(found.len(), 3, "{found:?}");
        assert!(found[0].starts_with("gateway[1]: `gw-2:7071` must start with https://"), "{found:?}");
        assert!(found[1].starts_with("gateway[2]: `http://gw-3:7071` is http:// but the `tls` section is set"));
        assert!(found[2].starts_with("gateway[3]: must name a gateway's gRPC address"), "{found:?}");
        let found = problems("insecure: true\ngateway: 'http://gw-1:7071,http://gw 2:7071/x'\n");
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].starts_with("gateway[1]: `http://gw 2:7071/x` is not a valid address"), "{found:?}");
        let found = problems("insecure: true\ngateway: [http://gw-1:7071/v1]\n");
        assert!(found[0].starts_with("gateway: `http://gw-1:7071/v1` has a path"), "{found:?}");
    }

    #[test]
    fn plain_text_entries_need_insecure_and_https_entries_need_tls() {
        let found = problems("gateway: [http://gw-1:7071, https://gw-2:7071]\n");
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found[0].starts_with("gateway[0]: `http://gw-1:7071` is plain text"), "{found:?}");
        assert!(found[1].starts_with("tls: the gateway `https://gw-2:7071` is https"), "{found:?}");
        assert!(matches!(parse("gateway: 42\n"), Err(Error::Parse { .. })));
    }

    #[test]
    fn a_list_is_written_back_as_a_list_and_one_address_as_a_string() {
        let config = parse(&format!("gateway: [https://gw-1:7071, https://gw-2:7071]\n{TLS}")).unwrap();
        let json = serde_json::to_value(&config).unwrap();
        assert_eq!(json["gateway"], serde_json::json!(["https://gw-1:7071", "https://gw-2:7071"]));
        let config = parse(&format!("gateway: https://gw:7071\n{TLS}")).unwrap();
        assert_eq!(serde_json::to_value(&config).unwrap()["gateway"], "https://gw:7071");
    }
}
