//! `tensile-scheduler endpoint`: the endpoint rule (`tensile_proto::endpoint`)
//! for shell scripts and scripts in other interpreters (the Slurm task
//! prolog), so that no script carries a copy of it.

use std::path::PathBuf;

use tensile_proto::endpoint::{self, GpuSocketError};

use crate::cli::EndpointArgs;

/// Why `endpoint` printed nothing: the exit status and the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointError {
    /// 1: a file that cannot be read, or a job's GPU not found; 3: `--gpu`
    /// names a GPU `gpus.json` does not list.
    pub status: u8,
    pub message: String,
}

impl EndpointError {
    fn failed(message: impl ToString) -> EndpointError {
        EndpointError {
            status: 1,
            message: message.to_string(),
        }
    }
}

/// What `tensile-scheduler endpoint` prints (one or more lines, no final
/// newline), from `args` and the process's environment.
pub fn endpoint(args: &EndpointArgs) -> Result<String, EndpointError> {
    let env = |name: &str| {
        if name == endpoint::SOCKET_DIR_ENV
            && let Some(d) = &args.socket_dir
        {
            return Some(d.display().to_string());
        }
        std::env::var(name).ok()
    };
    let dir: PathBuf = endpoint::socket_dir_with(&env);
    if let Some(index) = args.gpu {
        let found = endpoint::gpu_socket(&dir, index).map_err(|e| match e {
            GpuSocketError::NotServed { .. } => EndpointError {
                status: 3,
                message: e.to_string(),
            },
            GpuSocketError::File(e) => EndpointError::failed(e),
        })?;
        if !args.json {
            return Ok(found.socket.display().to_string());
        }
        let entry = found.entry.as_ref();
        let doc = serde_json::json!({
            "index": found.index,
            "socket": found.socket.display().to_string(),
            "budget_bytes": entry.map(|g| g.budget_bytes),
            "memory_bytes": entry.map(|g| g.memory_bytes),
        });
        return Ok(doc.to_string());
    }
    if args.all {
        let sockets = endpoint::gpu_sockets(&dir).map_err(EndpointError::failed)?;
        return Ok(sockets
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join("\n"));
    }
    let ordinal = endpoint::device_ordinal(args.device.as_deref().unwrap_or("cuda:0"));
    endpoint::resolve_server_with(None, ordinal, &env).map_err(EndpointError::failed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gpu_without_gpus_json_is_on_gpu_n_sock_and_one_not_listed_is_status_3() {
        let dir = tempfile::tempdir().expect("a folder");
        let args = EndpointArgs {
            socket_dir: Some(dir.path().to_path_buf()),
            gpu: Some(2),
            ..EndpointArgs::default()
        };
        assert_eq!(
            endpoint(&args),
            Ok(dir.path().join("gpu2.sock").display().to_string())
        );
        let json = endpoint(&EndpointArgs {
            json: true,
            ..args.clone()
        })
        .expect("found");
        let v: serde_json::Value = serde_json::from_str(&json).expect("JSON");
        assert_eq!(v["index"], 2);
        assert!(v["budget_bytes"].is_null());
        std::fs::write(
            dir.path().join("gpus.json"),
            r#"{"gpus": [{"index": 0, "uuid": "GPU-0", "name": "A100", "memory_bytes": 80, "budget_bytes": 40, "socket": "gpu0.sock"}]}"#,
        )
        .expect("written");
        let e = endpoint(&args).expect_err("not listed");
        assert_eq!(e.status, 3);
        assert!(e.message.contains("(it lists 0)"), "{}", e.message);
        let all = endpoint(&EndpointArgs {
            gpu: None,
            all: true,
            ..args
        });
        assert_eq!(all, Ok(dir.path().join("gpu0.sock").display().to_string()));
    }
}
