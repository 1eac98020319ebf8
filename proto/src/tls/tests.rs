//! Loading TLS files (a throwaway CA made here with rcgen) and the rule
//! that picks a client's transport.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};

use super::*;

/// A CA, a server certificate for 127.0.0.1/localhost signed by it, and a
/// second key pair, written as PEM files into `dir`.
fn files(dir: &Path) -> (PathBuf, PathBuf, PathBuf, PathBuf) {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, &ca_key);
    let key = KeyPair::generate().unwrap();
    let params =
        CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
    let cert = params.signed_by(&key, &issuer).unwrap();
    let other = KeyPair::generate().unwrap();
    let write = |name: &str, text: String| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    (
        write("ca.pem", ca_cert.pem()),
        write("cert.pem", cert.pem()),
        write("key.pem", key.serialize_pem()),
        write("other-key.pem", other.serialize_pem()),
    )
}

#[test]
fn server_files_load_and_bad_ones_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key, other) = files(dir.path());
    let ok = ServerTlsFiles {
        cert: cert.clone(),
        key: key.clone(),
        client_ca: Some(ca.clone()),
    };
    ok.load().unwrap();

    let load = |cert: &Path, key: &Path, client_ca: Option<&Path>| {
        ServerTlsFiles {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            client_ca: client_ca.map(Path::to_path_buf),
        }
        .load()
        .unwrap_err()
        .0
    };
    let missing = dir.path().join("missing.pem");
    let e = load(&missing, &key, None);
    assert!(
        e.starts_with("--tls-cert ") && e.contains("missing.pem"),
        "{e}"
    );
    let e = load(&cert, &other, None);
    assert!(
        e.contains("other-key.pem is not the key of the certificate in --tls-cert"),
        "{e}"
    );
    // A key file given as the certificate, and the other way round.
    let e = load(&key, &key, None);
    assert!(
        e.contains("--tls-cert") && e.contains("no certificate"),
        "{e}"
    );
    let e = load(&cert, &cert, None);
    assert!(
        e.contains("--tls-key") && e.contains("no private key"),
        "{e}"
    );
    let e = load(&cert, &key, Some(&key));
    assert!(
        e.contains("--tls-client-ca") && e.contains("key.pem"),
        "{e}"
    );

    assert_eq!(ServerTlsFiles::from_parts(None, None, None), Ok(None));
    let e = ServerTlsFiles::from_parts(Some(cert.clone()), None, None).unwrap_err();
    assert!(e.0.contains("needs --tls-key"), "{e}");
    let e = ServerTlsFiles::from_parts(None, None, Some(ca)).unwrap_err();
    assert!(
        e.0.contains("--tls-client-ca") && e.0.contains("needs --tls-cert"),
        "{e}"
    );
}

#[test]
fn client_files_load_from_flags_or_env_and_bad_ones_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key, other) = files(dir.path());
    let env = |vars: &[(&str, &Path)]| {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| ((*k).to_string(), v.display().to_string()))
            .collect();
        ClientTlsFiles::with_env(&move |name| {
            vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
        })
    };
    assert!(env(&[]).is_empty());
    assert!(env(&[]).load().unwrap().is_none());
    let full = env(&[(CA_ENV, &ca), (CERT_ENV, &cert), (KEY_ENV, &key)]);
    assert_eq!(full.ca.as_deref(), Some(ca.as_path()));
    assert!(full.load().unwrap().is_some());
    let e = env(&[(CERT_ENV, &cert), (KEY_ENV, &key)])
        .load()
        .unwrap_err();
    assert!(e.0.contains("need --tls-ca"), "{e}");
    let e = env(&[(CA_ENV, &ca), (CERT_ENV, &cert)]).load().unwrap_err();
    assert!(e.0.contains("needs --tls-key"), "{e}");
    let e = env(&[(CA_ENV, &ca), (CERT_ENV, &cert), (KEY_ENV, &other)])
        .load()
        .unwrap_err();
    assert!(e.0.contains("is not the key of the certificate"), "{e}");
    let e = env(&[(CA_ENV, &key)]).load().unwrap_err();
    assert!(
        e.0.starts_with("--tls-ca ") && e.0.contains("no certificate"),
        "{e}"
    );
}

#[test]
fn the_address_and_the_ca_pick_the_transport() {
    let t = |s: &str, tls: bool| transport(s, tls).unwrap();
    assert_eq!(
        t("unix:/tmp/s.sock", true),
        ("unix:///tmp/s.sock".into(), Transport::Unix)
    );
    assert_eq!(t("/tmp/s.sock", true).1, Transport::Unix);
    assert_eq!(t("h:5", false), ("http://h:5".into(), Transport::Plain));
    assert_eq!(t("h:5", true), ("https://h:5".into(), Transport::Tls));
    assert_eq!(
        t("http://h:5", true),
        ("http://h:5".into(), Transport::Plain)
    );
    assert_eq!(
        t("https://h:5", true),
        ("https://h:5".into(), Transport::Tls)
    );
    let e = transport("https://h:5", false).unwrap_err();
    assert!(e.0.contains("https needs --tls-ca"), "{e}");
}
