//! The cluster an agent's certificate names: a URI subject alternative name
//! `urn:meridian:cluster:NAME`.
//!
//! Only the URI form counts. A DNS name is not accepted as a cluster name: the same CA may well
//! issue DNS certificates for hosts, and a host called like a cluster must not become that
//! cluster's agent.
//!
//! The certificate has been verified by rustls (signature, chain, validity) before it gets
//! here, so this reads the few fields it needs with a minimal DER walk rather than a full X.509
//! parser; anything it does not understand yields no name (and the agent is refused).
//!
//! A CA signs what it is asked to: a name in a cluster URI SAN must still follow the cluster-name
//! grammar ([`meridian_proto::names`]) before the gateway takes it as a cluster, so that a
//! certificate for `west/../east` or `East` is refused rather than becoming a new cluster.

use meridian_proto::names::{ClusterNameError, check_cluster_name};

/// The prefix of the URI SAN that names a cluster.
pub const CLUSTER_URI_PREFIX: &str = "urn:meridian:cluster:";

/// DER tags used below.
const SEQUENCE: u8 = 0x30;
const OID: u8 = 0x06;
const BOOLEAN: u8 = 0x01;
const OCTET_STRING: u8 = 0x04;
/// `[3] EXPLICIT Extensions` in `TBSCertificate`.
const EXTENSIONS: u8 = 0xa3;
/// `uniformResourceIdentifier [6] IMPLICIT IA5String` in `GeneralName`.
const URI_NAME: u8 = 0x86;
/// 2.5.29.17, subjectAltName.
const SUBJECT_ALT_NAME: &[u8] = &[0x55, 0x1d, 0x11];

/// A cluster URI SAN whose name breaks the cluster-name grammar.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("URI SAN {} does not name a valid cluster: the name {reason}", shown(uri))]
pub struct InvalidClusterSan {
    /// The whole SAN, as the certificate carries it (shown escaped, and cut after 96 characters).
    pub uri: String,
    /// What is wrong with the name.
    pub reason: ClusterNameError,
}

/// The URI SAN that names `cluster`.
pub fn cluster_uri(cluster: &str) -> String {
    format!("{CLUSTER_URI_PREFIX}{cluster}")
}

/// The clusters a DER certificate names, in SAN order (usually one).
pub fn clusters_named(certificate: &[u8]) -> Vec<String> {
    uri_names(certificate)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|uri| uri.strip_prefix(CLUSTER_URI_PREFIX).map(str::to_string))
        .filter(|name| !name.is_empty())
        .collect()
}

/// The clusters a DER certificate names ([`clusters_named`]), each checked against the
/// cluster-name grammar: the first name that breaks it refuses the whole certificate, since a
/// CA that signed one malformed cluster name should not be trusted for the others.
pub fn certified_clusters(certificate: &[u8]) -> Result<Vec<String>, InvalidClusterSan> {
    let names = clusters_named(certificate);
    for name in &names {
        check_cluster_name(name).map_err(|reason| InvalidClusterSan { uri: cluster_uri(name), reason })?;
    }
    Ok(names)
}

/// A SAN as a message shows it: quoted with control characters escaped, and at most 96
/// characters of it.
fn shown(uri: &str) -> String {
    const SHOWN: usize = 96;
    let head: String = uri.chars().take(SHOWN).collect();
    if head.len() < uri.len() { format!("{head:?}…") } else { format!("{head:?}") }
}

/// Every URI SAN of a DER certificate; `None` when the structure is not what X.509 says.
fn uri_names(certificate: &[u8]) -> Option<Vec<String>> {
    let (tag, certificate, _) = tlv(certificate)?;
    if tag != SEQUENCE {
        return None;
    }
    let (tag, mut tbs, _) = tlv(certificate)?;
    if tag != SEQUENCE {
        return None;
    }
    while !tbs.is_empty() {
        let (tag, value, rest) = tlv(tbs)?;
        tbs = rest;
        if tag == EXTENSIONS {
            return sans_in_extensions(value);
        }
    }
    Some(Vec::new())
}

fn sans_in_extensions(explicit: &[u8]) -> Option<Vec<String>> {
    let (tag, mut extensions, _) = tlv(explicit)?;
    if tag != SEQUENCE {
        return None;
    }
    let mut names = Vec::new();
    while !extensions.is_empty() {
        let (tag, extension, rest) = tlv(extensions)?;
        extensions = rest;
        if tag != SEQUENCE {
            return None;
        }
        let (tag, oid, mut fields) = tlv(extension)?;
        if tag != OID || oid != SUBJECT_ALT_NAME {
            continue;
        }
        let (mut tag, mut value, rest) = tlv(fields)?;
        if tag == BOOLEAN {
            fields = rest;
            (tag, value, _) = tlv(fields)?;
        }
        if tag != OCTET_STRING {
            return None;
        }
        let (tag, mut general_names, _) = tlv(value)?;
        if tag != SEQUENCE {
            return None;
        }
        while !general_names.is_empty() {
            let (tag, name, rest) = tlv(general_names)?;
            general_names = rest;
            if tag == URI_NAME {
                names.push(String::from_utf8(name.to_vec()).ok()?);
            }
        }
    }
    Some(names)
}

/// Splits one DER tag-length-value off `input`: (tag, value, rest). Only single-byte tags and
/// definite lengths of up to four bytes, which is all DER certificates use.
fn tlv(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    if tag & 0x1f == 0x1f {
        return None;
    }
    let (&first, mut rest) = rest.split_first()?;
    let length = if first < 0x80 {
        usize::from(first)
    } else {
        let count = usize::from(first & 0x7f);
        if count == 0 || count > 4 || rest.len() < count {
            return None;
        }
        let (bytes, after) = rest.split_at(count);
        rest = after;
        bytes.iter().fold(0usize, |length, &b| (length << 8) | usize::from(b))
    };
    if rest.len() < length {
        return None;
    }
    let (value, rest) = rest.split_at(length);
    Some((tag, value, rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn certificate_with(sans: Vec<rcgen::SanType>) -> Vec<u8> {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::default();
        params.subject_alt_names = sans;
        params.self_signed(&key).unwrap().der().to_vec()
    }

    fn uri(text: &str) -> rcgen::SanType {
        rcgen::SanType::URI(text.try_into().unwrap())
    }

    #[test]
    fn the_cluster_uri_san_names_the_cluster() {
        let der = certificate_with(vec![
            rcgen::SanType::DnsName("east".try_into().unwrap()),
            uri("https://example.com/"),
            uri(&cluster_uri("onprem-east")),
        ]);
        assert_eq!(clusters_named(&der), ["onprem-east"]);
    }

    #[test]
    fn a_dns_name_alone_names_no_cluster() {
        let der = certificate_with(vec![rcgen::SanType::DnsName("east".try_into().unwrap())]);
        assert!(clusters_named(&der).is_empty());
        assert!(clusters_named(&certificate_with(Vec::new())).is_empty());
        assert!(clusters_named(&certificate_with(vec![uri(CLUSTER_URI_PREFIX)])).is_empty(), "an empty name");
    }

    #[test]
    fn a_cluster_san_that_breaks_the_name_grammar_refuses_the_certificate_with_the_reason() {
        let good = certificate_with(vec![uri(&cluster_uri("onprem-east"))]);
        assert_eq!(certified_clusters(&good), Ok(vec!["onprem-east".to_string()]));
        assert_eq!(certified_clusters(&certificate_with(Vec::new())), Ok(Vec::new()));

        let traversal = certificate_with(vec![uri(&cluster_uri("west/../east"))]);
        let refused = certified_clusters(&traversal).unwrap_err();
        assert_eq!(refused.uri, "urn:meridian:cluster:west/../east");
        assert_eq!(refused.reason, ClusterNameError::BadCharacter { position: 5, character: '/' });
        assert!(refused.to_string().contains("the name has `/` at character 5;"), "{refused}");

        let long = certified_clusters(&certificate_with(vec![uri(&cluster_uri(&"a".repeat(300)))])).unwrap_err();
        assert!(long.to_string().contains("aaaa\"… does not name"), "{long}");
        assert!(long.to_string().contains("is 300 characters long"), "{long}");

        for bad in ["East", "a b", "-east", &"a".repeat(64)] {
            let der = certificate_with(vec![uri(&cluster_uri("east")), uri(&cluster_uri(bad))]);
            assert_eq!(clusters_named(&der).len(), 2, "{bad}: the raw reader still sees both");
            assert!(certified_clusters(&der).is_err(), "{bad}: one bad name refuses the certificate");
        }
    }

    #[test]
    fn every_truncation_and_garbage_yields_no_name_and_no_panic() {
        let der = certificate_with(vec![uri(&cluster_uri("a"))]);
        for end in 0..der.len() {
            assert!(clusters_named(&der[..end]).is_empty(), "truncated at {end}");
        }
        let mut flipped = der.clone();
        for i in 0..flipped.len() {
            flipped[i] ^= 0xff;
            let _ = clusters_named(&flipped);
            flipped[i] ^= 0xff;
        }
        assert!(clusters_named(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]).is_empty());
    }
}
