//! TLS on TCP with a throwaway CA made here (rcgen): the scheduler on
//! 127.0.0.1:0 reached over TLS by the generated client (status, health)
//! and by a job's session; a plaintext client, an untrusted server and,
//! under mutual TLS, a client without a certificate or with one from
//! another CA all refused, with errors that say so.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use tensile_proto::pb;
use tensile_proto::pb::memory_scheduler_client::MemorySchedulerClient;
use tensile_proto::tls::{ClientTls, ClientTlsFiles, ServerTlsFiles, Transport};
use tensile_scheduler::cli::Args;

use crate::util::{self, Server};

/// A CA's files, and what it signs.
struct Ca {
    cert: PathBuf,
    key: KeyPair,
    params: CertificateParams,
}

impl Ca {
    fn new(dir: &Path, name: &str) -> Ca {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, format!("{name} test CA"));
        let cert = params.self_signed(&key).unwrap();
        let path = dir.join(format!("{name}-ca.pem"));
        std::fs::write(&path, cert.pem()).unwrap();
        Ca {
            cert: path,
            key,
            params,
        }
    }

    /// A certificate for `names` signed by this CA: (cert, key) files.
    fn sign(&self, dir: &Path, file: &str, names: &[&str]) -> (PathBuf, PathBuf) {
        let issuer = Issuer::from_params(&self.params, &self.key);
        let key = KeyPair::generate().unwrap();
        let params =
            CertificateParams::new(names.iter().map(|n| (*n).to_string()).collect::<Vec<_>>())
                .unwrap();
        let cert = params.signed_by(&key, &issuer).unwrap();
        let (c, k) = (
            dir.join(format!("{file}.pem")),
            dir.join(format!("{file}-key.pem")),
        );
        std::fs::write(&c, cert.pem()).unwrap();
        std::fs::write(&k, key.serialize_pem()).unwrap();
        (c, k)
    }
}

/// Everything the tests use: a CA with a server and a client certificate,
/// another CA with a client certificate of its own.
struct Pki {
    _dir: tempfile::TempDir,
    ca: PathBuf,
    server: (PathBuf, PathBuf),
    client: (PathBuf, PathBuf),
    other_ca: PathBuf,
    other_client: (PathBuf, PathBuf),
}

fn pki() -> Pki {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(dir.path(), "tensile");
    let other = Ca::new(dir.path(), "other");
    Pki {
        server: ca.sign(dir.path(), "server", &["localhost", "127.0.0.1"]),
        client: ca.sign(dir.path(), "client", &["job"]),
        other_client: other.sign(dir.path(), "other-client", &["job"]),
        ca: ca.cert,
        other_ca: other.cert,
        _dir: dir,
    }
}

/// A scheduler on 127.0.0.1:0 serving TLS (mutual when `client_ca`).
async fn scheduler(p: &Pki, client_ca: Option<&Path>) -> Server {
    let mut config = util::config();
    config.tls = Some(
        ServerTlsFiles {
            cert: p.server.0.clone(),
            key: p.server.1.clone(),
            client_ca: client_ca.map(Path::to_path_buf),
        }
        .load()
        .unwrap(),
    );
    util::tcp(config).await
}

fn client_tls(ca: &Path, identity: Option<&(PathBuf, PathBuf)>) -> ClientTls {
    ClientTlsFiles {
        ca: Some(ca.to_path_buf()),
        cert: identity.map(|i| i.0.clone()),
        key: identity.map(|i| i.1.clone()),
    }
    .load()
    .unwrap()
    .unwrap()
}

/// GetStatus over a fresh connection to `address`: the error, if any, as
/// the clients explain it (the TLS reason when there is one).
async fn status(address: &str, tls: Option<&ClientTls>) -> Result<pb::GetStatusResponse, String> {
    let (endpoint, how) = tensile_proto::tls::endpoint(address, tls).map_err(|e| e.0)?;
    assert_eq!(how == Transport::Tls, tls.is_some(), "{address}");
    let ch = endpoint
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| tensile_proto::tls::explain(&e, tls).unwrap_or_else(|| e.to_string()))?;
    let mut c = MemorySchedulerClient::new(ch);
    let call = c.get_status(pb::GetStatusRequest { job_id: 0 });
    match tokio::time::timeout(Duration::from_secs(10), call).await {
        Ok(Ok(r)) => Ok(r.into_inner()),
        Ok(Err(s)) => Err(tensile_proto::tls::explain(&s, tls)
            .or_else(|| tls.and_then(|t| tensile_proto::tls::probe(address, t)))
            .unwrap_or_else(|| s.to_string())),
        Err(_) => Err("no answer within 10 s".into()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_serves_status_and_health_and_refuses_plaintext_and_strangers() {
    let p = pki();
    let s = scheduler(&p, None).await;
    let tls = client_tls(&p.ca, None);
    // By IP address, by name, and as https://.
    let port = s.address.rsplit_once(':').unwrap().1;
    for address in [
        s.address.clone(),
        format!("localhost:{port}"),
        format!("https://127.0.0.1:{port}"),
    ] {
        let st = status(&address, Some(&tls)).await.unwrap();
        assert_eq!(st.device, "a6000", "{address}");
    }
    // Health is served on the TLS listener too.
    let (endpoint, _) = tensile_proto::tls::endpoint(&s.address, Some(&tls)).unwrap();
    let ch = endpoint.connect().await.unwrap();
    util::assert_serving(ch).await;

    // A plaintext client gets nothing from the TLS listener.
    let plain = status(&format!("http://{}", s.address), None).await;
    assert!(plain.is_err(), "plaintext was answered: {plain:?}");
    let (ch, plain) = (
        tensile_proto::tls::endpoint(&s.address, None)
            .unwrap()
            .0
            .connect()
            .await
            .unwrap(),
        &s.address,
    );
    let refused = MemorySchedulerClient::new(ch)
        .get_status(pb::GetStatusRequest { job_id: 0 })
        .await
        .unwrap_err();
    let hint = tensile_proto::tls::plaintext_hint(plain, &refused).unwrap_or_default();
    assert!(
        hint.contains("serves TLS there: pass --tls-ca"),
        "{refused:?}"
    );
    // https:// without a CA is refused before connecting.
    let e = tensile_proto::tls::endpoint(&format!("https://{}", s.address), None).unwrap_err();
    assert!(e.0.contains("--tls-ca"), "{e}");
    // A client trusting another CA refuses the server, saying why.
    let e = status(&s.address, Some(&client_tls(&p.other_ca, None)))
        .await
        .unwrap_err();
    assert!(
        e.contains("not signed by the CA in --tls-ca") && e.contains("other-ca.pem"),
        "{e}"
    );
    // A TLS client of a plaintext scheduler is told it does not speak TLS.
    let plain_server = util::tcp(util::config()).await;
    let e = status(&plain_server.address, Some(&tls)).await.unwrap_err();
    assert!(e.contains("does not speak TLS"), "{e}");
    // The refusals left the listener serving.
    status(&s.address, Some(&tls)).await.unwrap();
    plain_server.stop().await;
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_wants_a_certificate_from_the_client_ca() {
    let p = pki();
    let s = scheduler(&p, Some(&p.ca)).await;
    let e = status(&s.address, Some(&client_tls(&p.ca, None)))
        .await
        .unwrap_err();
    assert!(e.contains("requires a client certificate"), "{e}");
    let e = status(&s.address, Some(&client_tls(&p.ca, Some(&p.other_client))))
        .await
        .unwrap_err();
    assert!(e.contains("refused this client's certificate"), "{e}");
    status(&s.address, Some(&client_tls(&p.ca, Some(&p.client))))
        .await
        .unwrap();
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_session_registers_over_mutual_tls() {
    let p = pki();
    let s = scheduler(&p, Some(&p.ca)).await;
    let said = Arc::new(Mutex::new(Vec::<String>::new()));
    let log = said.clone();
    let config = |tls: ClientTls| tensile_session::SessionConfig {
        server: Some(s.address.clone()),
        device_ordinal: 0,
        name: "tls-job".into(),
        priority: 0,
        allow_recompute: None,
        base_bytes: None,
        process: None,
        max_backoff: Duration::from_millis(200),
        call_timeout: Some(Duration::from_secs(5)),
        tls: Some(tls),
        log: {
            let log = log.clone();
            tensile_session::LogSink::new(move |_, m| log.lock().unwrap().push(m.to_string()))
        },
    };
    let g = util::mlp(256);
    let job =
        tensile_session::Session::start(g.clone(), config(client_tls(&p.ca, Some(&p.client))))
            .unwrap();
    let plan = tokio::task::spawn_blocking(move || {
        let plan = job.wait_for_plan(Duration::from_secs(20));
        job.finish(Duration::from_secs(2));
        plan
    })
    .await
    .unwrap();
    assert!(
        plan.is_some(),
        "no plan over TLS: {:?}",
        said.lock().unwrap()
    );

    // Without a certificate the session keeps trying, and says why.
    said.lock().unwrap().clear();
    let job = tensile_session::Session::start(g, config(client_tls(&p.ca, None))).unwrap();
    let plan = tokio::task::spawn_blocking(move || {
        let plan = job.wait_for_plan(Duration::from_secs(2));
        job.finish(Duration::from_secs(1));
        plan
    })
    .await
    .unwrap();
    assert!(plan.is_none());
    let said = said.lock().unwrap().join("\n");
    assert!(said.contains("requires a client certificate"), "{said}");
    s.stop().await;
}

#[test]
fn a_public_address_is_allowed_with_tls_and_the_file_names_the_files() {
    let p = pki();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("s.toml");
    std::fs::write(
        &file,
        format!(
            "listen = [\"0.0.0.0:0\"]\ndevice = \"a6000\"\nstate = \"none\"\ntls_cert = {:?}\ntls_key = {:?}\ntls_client_ca = {:?}\n",
            p.server.0, p.server.1, p.ca
        ),
    )
    .unwrap();
    let r = Args {
        config: Some(file.clone()),
        ..Args::default()
    }
    .resolve()
    .unwrap();
    let tls = r.config.tls.unwrap();
    assert_eq!(tls.files.client_ca.as_deref(), Some(p.ca.as_path()));
    assert!(
        r.notes.iter().any(|n| n.starts_with("TLS on 0.0.0.0:0")),
        "{:?}",
        r.notes
    );
    // Without TLS the same address needs --insecure, and says TLS would do.
    let e = Args {
        listen: vec!["0.0.0.0:0".into()],
        device: Some("a6000".into()),
        ..Args::default()
    }
    .resolve()
    .unwrap_err();
    assert!(
        matches!(e, tensile_scheduler::ConfigError::PlaintextOffHost(_)),
        "{e:?}"
    );
    let e = e.to_string();
    assert!(e.contains("--tls-cert") && e.contains("--insecure"), "{e}");
    // A flag wins over the file; a key that is not the certificate's is
    // named.
    let e = Args {
        config: Some(file),
        tls_key: Some(p.client.1.clone()),
        ..Args::default()
    }
    .resolve()
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("client-key.pem is not the key of the certificate in --tls-cert"),
        "{e}"
    );
    let e = Args {
        listen: vec!["127.0.0.1:0".into()],
        tls_cert: Some(p.server.0.clone()),
        ..Args::default()
    }
    .resolve()
    .unwrap_err()
    .to_string();
    assert!(e.contains("needs --tls-key"), "{e}");
}
