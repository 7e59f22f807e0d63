//! The gateway's TLS loader and reloader with the files `meridian certs` makes: each bad or
//! missing file is named with its field, and a rotation is picked up only once it is whole.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

use std::path::Path;
use std::sync::Arc;

use meridian::certs::{Ca, Pair, Validity};
use meridian_gateway::tls::{Reloader, TlsConfig, load};
use meridian_proto::duration::HumanDuration;

/// A CA, a gateway certificate and the files of a `tls` section in `dir`.
fn write_files(dir: &Path) -> (Ca, TlsConfig) {
    let ca = Ca::generate(Validity::days(1)).unwrap();
    let server = ca.server(&[], Validity::days(1)).unwrap();
    std::fs::write(dir.join("ca.pem"), &ca.pair.cert_pem).unwrap();
    write_pair(dir, "gateway", &server);
    let config = TlsConfig {
        cert: dir.join("gateway.pem"),
        key: dir.join("gateway.key"),
        client_ca: dir.join("ca.pem"),
        reload_interval: HumanDuration::from_secs(5),
        handshake_timeout: HumanDuration::from_secs(10),
        max_connections: 16,
    };
    (ca, config)
}

fn write_pair(dir: &Path, name: &str, pair: &Pair) {
    std::fs::write(dir.join(format!("{name}.pem")), &pair.cert_pem).unwrap();
    std::fs::write(dir.join(format!("{name}.key")), &pair.key_pem).unwrap();
}

#[test]
fn missing_and_bad_files_are_named_with_their_field() {
    let dir = tempfile::tempdir().unwrap();
    let (_, config) = write_files(dir.path());
    assert!(load(&config).is_ok());

    let missing = TlsConfig { client_ca: dir.path().join("nope.pem"), ..config.clone() };
    let err = load(&missing).unwrap_err().to_string();
    assert!(err.starts_with("tls.clientCa: cannot read") && err.contains("nope.pem"), "{err}");

    std::fs::write(dir.path().join("empty.pem"), "not pem\n").unwrap();
    let empty = TlsConfig { cert: dir.path().join("empty.pem"), ..config.clone() };
    let err = load(&empty).unwrap_err().to_string();
    assert!(err.starts_with("tls.cert:") && err.contains("no `BEGIN CERTIFICATE`"), "{err}");

    let other = Ca::generate(Validity::days(1)).unwrap().server(&[], Validity::days(1)).unwrap();
    std::fs::write(dir.path().join("other.key"), &other.key_pem).unwrap();
    let mismatched = TlsConfig { key: dir.path().join("other.key"), ..config };
    let err = load(&mismatched).unwrap_err().to_string();
    assert!(err.starts_with("tls.key:"), "{err}");
}

#[test]
fn a_changed_file_is_reloaded_and_a_bad_one_keeps_the_old_config() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, config) = write_files(dir.path());
    let mut reloader = Reloader::new(&config).unwrap();
    let current = reloader.subscribe();
    let first = current.borrow().clone();
    assert!(!reloader.check(), "nothing changed");

    // A half-written rotation: a new certificate with the old key does not load.
    let rotated = ca.server(&["new.example".into()], Validity::days(1)).unwrap();
    std::fs::write(dir.path().join("gateway.pem"), &rotated.cert_pem).unwrap();
    assert!(!reloader.check());
    assert!(Arc::ptr_eq(&first, &current.borrow()), "the old config stays in use");

    std::fs::write(dir.path().join("gateway.key"), &rotated.key_pem).unwrap();
    assert!(reloader.check());
    assert!(!Arc::ptr_eq(&first, &current.borrow()));
}
