//! `tensilectl status` and `plan --server` against a scheduler serving
//! mutual TLS on 127.0.0.1:0 (the library in this process, configured as
//! the binary is by its flags), with a throwaway CA made here (rcgen):
//! the flags and the TENSILE_TLS_* variables alike; without a client
//! certificate, trusting another CA, or in plaintext, the command fails
//! saying why.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use tensile_scheduler::cli::{Args, Serve};
use tensile_scheduler::{Listener, run};

use super::{TempDir, text};

/// A CA (`NAME-ca.pem`) and certificates it signs for `leaves`: (file
/// stem, subject alternative names), each `STEM.pem` and `STEM-key.pem`.
fn ca(dir: &Path, name: &str, leaves: &[(&str, &[&str])]) -> PathBuf {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let cert = params.self_signed(&key).unwrap();
    let issuer = Issuer::new(params, &key);
    for (stem, names) in leaves {
        let k = KeyPair::generate().unwrap();
        let names: Vec<String> = names.iter().map(|n| (*n).to_string()).collect();
        let c = CertificateParams::new(names)
            .unwrap()
            .signed_by(&k, &issuer)
            .unwrap();
        std::fs::write(dir.join(format!("{stem}.pem")), c.pem()).unwrap();
        std::fs::write(dir.join(format!("{stem}-key.pem")), k.serialize_pem()).unwrap();
    }
    let path = dir.join(format!("{name}-ca.pem"));
    std::fs::write(&path, cert.pem()).unwrap();
    path
}

/// `tensilectl ARGS` with the TLS variables `env` and no others.
fn ctl(args: &[&str], env: &[(&str, &Path)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_tensilectl"));
    c.args(args);
    for v in [
        "TENSILE_SERVER",
        "TENSILE_TLS_CA",
        "TENSILE_TLS_CERT",
        "TENSILE_TLS_KEY",
    ] {
        c.env_remove(v);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

#[test]
fn status_and_plan_over_mutual_tls_by_flag_or_env() {
    let dir = TempDir::new("tls");
    let d = &dir.0;
    let ca_pem = ca(
        d,
        "tensile",
        &[
            ("server", &["127.0.0.1", "localhost"]),
            ("client", &["job"]),
        ],
    );
    let other_ca = ca(d, "other", &[]);
    let resolved = Args {
        listen: vec!["127.0.0.1:0".into()],
        tls_cert: Some(d.join("server.pem")),
        tls_key: Some(d.join("server-key.pem")),
        tls_client_ca: Some(ca_pem.clone()),
        device: Some("a6000".into()),
        latency_models: Some("roofline".into()),
        state: Some("none".into()),
        ..Args::default()
    }
    .resolve_with(&Vec::new)
    .unwrap();
    let Serve::Listen(addrs) = resolved.serve else {
        panic!("{:?}", resolved.serve)
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let listener = rt.block_on(Listener::bind(&addrs[0])).unwrap();
    let address = listener.address();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = rt.spawn(run(vec![listener], resolved.config, async {
        let _ = stopped.await;
    }));

    let (cert, key) = (d.join("client.pem"), d.join("client-key.pem"));
    let flags = |ca: &Path| {
        vec![
            "--tls-ca".to_string(),
            ca.display().to_string(),
            "--tls-cert".into(),
            cert.display().to_string(),
            "--tls-key".into(),
            key.display().to_string(),
        ]
    };
    let status = |extra: Vec<String>, env: &[(&str, &Path)]| {
        let mut args = vec!["status", "--json", "--server", &address];
        args.extend(extra.iter().map(String::as_str));
        ctl(&args, env)
    };
    // By flags.
    let out = status(flags(&ca_pem), &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["device"], "a6000");
    // By the environment, as https://.
    let https = format!("https://{address}");
    let env: [(&str, &Path); 3] = [
        ("TENSILE_TLS_CA", &ca_pem),
        ("TENSILE_TLS_CERT", &cert),
        ("TENSILE_TLS_KEY", &key),
    ];
    let out = ctl(&["status", "--server", &https], &env);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("a6000"), "{}", text(&out.stdout));
    let out = ctl(
        &[
            "plan", "--model", "resnet50", "--batch", "2", "--server", &https,
        ],
        &env,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));

    // No client certificate: refused, and told what to pass.
    let out = status(vec!["--tls-ca".into(), ca_pem.display().to_string()], &[]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("requires a client certificate") && err.contains("--tls-cert"),
        "{err}"
    );
    // Trusting another CA: the server is not trusted.
    let out = status(flags(&other_ca), &[]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("not signed by the CA in --tls-ca") && err.contains("other-ca.pem"),
        "{err}"
    );
    // Plaintext to the TLS listener gets no status.
    let out = status(Vec::new(), &[]);
    assert!(!out.status.success(), "{}", text(&out.stdout));
    let err = text(&out.stderr);
    assert!(err.contains("serves TLS there: pass --tls-ca"), "{err}");
    // A key that is not the certificate's is named before connecting.
    let mut wrong = flags(&ca_pem);
    wrong[5] = d.join("server-key.pem").display().to_string();
    let out = status(wrong, &[]);
    let err = text(&out.stderr);
    assert!(
        err.contains("server-key.pem is not the key of the certificate"),
        "{err}"
    );

    let _ = stop.send(());
    rt.block_on(server).unwrap().unwrap();
}
