//! The `tls` section: what is required and its defaults. Loading and reloading real
//! certificate files is tested in crate `meridian` (`gateway/meridian/tests/tls_files.rs`), where
//! `meridian certs` makes them.

use std::path::Path;
use std::time::Duration;

use super::*;

#[test]
fn neither_tls_nor_insecure_is_a_config_error_that_says_what_to_do() {
    let problems = problems(None, false);
    assert_eq!(problems.len(), 1);
    assert!(problems[0].starts_with("tls:"), "{problems:?}");
    assert!(problems[0].contains("meridian certs init") && problems[0].contains("insecure: true"));
    assert!(super::problems(None, true).is_empty());
    let text = "tls: {cert: g.pem, key: g.key, clientCa: ca.pem}\ninsecure: true\n";
    let err = crate::config::GatewayConfig::parse(text, Path::new("g.yaml")).unwrap_err().to_string();
    assert!(err.contains("insecure: true contradicts"), "{err}");
    let err = crate::config::GatewayConfig::parse("", Path::new("g.yaml")).unwrap_err().to_string();
    assert!(err.contains("tls:"), "{err}");
}

#[test]
fn a_tls_section_parses_with_defaults() {
    let text = "tls: {cert: g.pem, key: g.key, clientCa: ca.pem}\n";
    let config = crate::config::GatewayConfig::parse(text, Path::new("g.yaml")).unwrap();
    let tls = config.tls.unwrap();
    assert_eq!(tls.client_ca, Path::new("ca.pem"));
    assert_eq!(tls.limits(), ConnLimits::default());
    assert_eq!(tls.reload_interval.0, Duration::from_secs(5));
}
