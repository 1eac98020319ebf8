//! The resolution rule on the table shared with the Python client
//! (`proto/tests/server-resolution.json`), and the addresses' URIs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::*;

#[test]
fn client_targets_become_uris() {
    assert_eq!(client_uri(Some("unix:/tmp/x.sock")), "unix:///tmp/x.sock");
    assert_eq!(client_uri(Some("unix:///tmp/x.sock")), "unix:///tmp/x.sock");
    assert_eq!(client_uri(Some("/tmp/x.sock")), "unix:///tmp/x.sock");
    assert_eq!(client_uri(Some("127.0.0.1:5")), "http://127.0.0.1:5");
    assert_eq!(client_uri(Some("http://h:5")), "http://h:5");
    assert!(client_uri(None).starts_with("unix:///"));
    assert!(client_uri(None).ends_with("/scheduler.sock"));
}

#[test]
fn device_names_give_their_ordinal() {
    assert_eq!(device_ordinal("cuda:3"), 3);
    assert_eq!(device_ordinal("cuda"), 0);
    assert_eq!(device_ordinal("cpu"), 0);
    assert_eq!(device_ordinal("cuda:x"), 0);
}

/// A directory of its own under the system's temp dir, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(case: usize) -> Scratch {
        let dir =
            std::env::temp_dir().join(format!("tensile-resolution-{}-{case}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn fill(text: &str, dir: &Path) -> String {
    text.replace("{dir}", &dir.display().to_string())
}

#[test]
fn the_shared_table_resolves_as_written() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/server-resolution.json");
    let table: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let gpus = serde_json::to_string(&table["gpus_json"]).unwrap();
    // The table's file is a valid one.
    assert_eq!(GpusFile::parse(&gpus).unwrap().gpus.len(), 4);
    let cases = table["cases"].as_array().unwrap();
    assert!(cases.len() >= 20);
    for (i, case) in cases.iter().enumerate() {
        let name = case["name"].as_str().unwrap();
        let scratch = Scratch::new(i);
        let dir = scratch.0.as_path();
        for (file, content) in case["files"].as_object().unwrap() {
            let content = content.as_str().unwrap();
            let path = dir.join(file);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            let text = if content == "table" {
                gpus.as_str()
            } else {
                content
            };
            std::fs::write(path, text).unwrap();
        }
        let env: BTreeMap<String, String> = case["env"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), fill(v.as_str().unwrap(), dir)))
            .collect();
        let lookup = |k: &str| env.get(k).cloned();
        let ordinal = case["ordinal"].as_u64().unwrap_or(0) as u32;
        let got = resolve_server_with(case["explicit"].as_str(), ordinal, &lookup);
        let expect = &case["expect"];
        if let Some(target) = expect["target"].as_str() {
            assert_eq!(got, Ok(fill(target, dir)), "case {name:?}");
        } else {
            let err = got.expect_err(name).0;
            for part in expect["error"].as_array().unwrap() {
                let part = fill(part.as_str().unwrap(), dir);
                assert!(err.contains(&part), "case {name:?}: {err:?} lacks {part:?}");
            }
        }
    }
}

#[test]
fn a_gpus_socket_is_the_one_gpus_json_gives_else_gpu_n_sock() {
    let scratch = Scratch::new(10_000);
    let dir = &scratch.0;
    // No gpus.json: one scheduler per GPU, on gpuN.sock.
    let found = gpu_socket(dir, 3).unwrap();
    assert_eq!(found.socket, dir.join("gpu3.sock"));
    assert!(found.entry.is_none());
    assert!(gpu_sockets(dir).unwrap_err().0.contains("gpus.json"));
    let file = GpusFile {
        gpus: [(0, "gpu0.sock"), (2, "/elsewhere/two.sock")]
            .into_iter()
            .map(|(index, socket)| GpuEntry {
                index,
                uuid: format!("GPU-{index}"),
                name: "A100".into(),
                memory_bytes: 80,
                budget_bytes: 40,
                socket: socket.into(),
            })
            .collect(),
    };
    std::fs::write(dir.join(GPUS_FILE), serde_json::to_string(&file).unwrap()).unwrap();
    let found = gpu_socket(dir, 2).unwrap();
    assert_eq!(found.socket, PathBuf::from("/elsewhere/two.sock"));
    assert_eq!(found.entry.unwrap().budget_bytes, 40);
    assert_eq!(gpu_socket(dir, 0).unwrap().socket, dir.join("gpu0.sock"));
    let err = gpu_socket(dir, 1).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "GPU 1 is not served by the scheduler of {} (it lists 0, 2)",
            dir.join(GPUS_FILE).display()
        )
    );
    assert_eq!(
        gpu_sockets(dir).unwrap(),
        vec![dir.join("gpu0.sock"), PathBuf::from("/elsewhere/two.sock")]
    );
    std::fs::write(dir.join(GPUS_FILE), "{\"gpus\": [{\"index\": 0}]}").unwrap();
    let err = gpu_socket(dir, 0).unwrap_err().to_string();
    assert!(err.contains("gpus.json: not a gpus file"), "{err}");
}
