//! Running a workload: directly (never through a shell), with a cleared environment, in a
//! process group of its own so that a time limit or a cancellation kills the whole tree,
//! and with its output captured up to a size cap.

use std::{
    collections::BTreeMap,
    process::{ExitStatus, Stdio},
    time::Duration,
};

use nix::{sys::signal::Signal, unistd::Pid};
use tokio::{
    io::{AsyncRead, AsyncReadExt},
    process::Command,
};
use tokio_util::sync::CancellationToken;

/// One run of a program.
#[derive(Debug, Clone)]
pub struct RunSpec {
    pub program: String,
    pub args: Vec<String>,
    /// The complete environment of the child (nothing else is inherited).
    pub env: BTreeMap<String, String>,
    pub working_dir: Option<String>,
    pub timeout: Duration,
    /// Bytes kept of each of stdout and stderr.
    pub output_limit: usize,
}

#[derive(Debug)]
pub struct RunOutput {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("cannot start {program}: {source}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("ran longer than {0:?} and was killed")]
    TimedOut(Duration),
    #[error("cancelled")]
    Cancelled,
    #[error("waiting for the process failed: {0}")]
    Wait(#[source] std::io::Error),
}

/// The environment a workload gets: the allow-listed variables of ours, then its own.
pub fn workload_environment(
    allowlist: &[String],
    own: &BTreeMap<String, String>,
    gpu_index: u32,
) -> BTreeMap<String, String> {
    let mut env: BTreeMap<String, String> = allowlist
        .iter()
        .filter_map(|key| std::env::var(key).ok().map(|value| (key.clone(), value)))
        .collect();
    env.extend(own.iter().map(|(k, v)| (k.clone(), v.clone())));
    env.insert("CUDA_VISIBLE_DEVICES".into(), gpu_index.to_string());
    env
}

/// Reads everything (so the child never blocks on a full pipe) and keeps the first
/// `limit` bytes.
async fn read_capped(mut stream: impl AsyncRead + Unpin, limit: usize) -> String {
    let mut kept = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let room = limit.saturating_sub(kept.len());
                kept.extend_from_slice(&chunk[..n.min(room)]);
            }
        }
    }
    String::from_utf8_lossy(&kept).into_owned()
}

fn kill_group(pid: u32) {
    // The child leads its own process group, whose id is its pid.
    if let Err(error) = nix::sys::signal::killpg(Pid::from_raw(pid as i32), Signal::SIGKILL) {
        tracing::debug!(%error, pid, "killpg failed (the group may be gone already)");
    }
}

/// Runs the program to completion, or kills its whole process group when the time limit
/// passes or `cancel` fires. `started` gets the child's pid (= its process group id).
pub async fn run(
    spec: &RunSpec,
    cancel: &CancellationToken,
    started: impl FnOnce(u32),
) -> Result<RunOutput, RunError> {
    let mut command = Command::new(&spec.program);
    command
        .args(&spec.args)
        .env_clear()
        .envs(&spec.env)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    if let Some(dir) = &spec.working_dir {
        command.current_dir(dir);
    }
    let mut child = command.spawn().map_err(|source| RunError::Spawn {
        program: spec.program.clone(),
        source,
    })?;
    let pid = child.id().unwrap_or_default();
    started(pid);
    let stdout = tokio::spawn(read_capped(
        child.stdout.take().expect("piped"),
        spec.output_limit,
    ));
    let stderr = tokio::spawn(read_capped(
        child.stderr.take().expect("piped"),
        spec.output_limit,
    ));

    let outcome = tokio::select! {
        status = child.wait() => status.map_err(RunError::Wait),
        _ = tokio::time::sleep(spec.timeout) => Err(RunError::TimedOut(spec.timeout)),
        _ = cancel.cancelled() => Err(RunError::Cancelled),
    };
    // Whatever happened, nothing of the workload may outlive the run: grandchildren too.
    kill_group(pid);
    if outcome.is_err() {
        let _ = child.wait().await;
    }
    let status = outcome?;
    let stdout = stdout.await.unwrap_or_default();
    let stderr = stderr.await.unwrap_or_default();
    Ok(RunOutput {
        status,
        stdout,
        stderr,
    })
}

/// The workload's throughput from its output: the last match of `pattern` (value in the
/// first capture group, unit in the second if any), or of the line
/// `COLOC_THROUGHPUT <value> <unit>`.
pub fn parse_throughput(stdout: &str, pattern: Option<&str>) -> Result<(f64, String), String> {
    const DEFAULT: &str = r"(?m)^COLOC_THROUGHPUT\s+(\S+)(?:[ \t]+(\S+))?";
    let regex = regex::Regex::new(pattern.unwrap_or(DEFAULT))
        .map_err(|e| format!("the throughput regex does not compile: {e}"))?;
    let captures = regex
        .captures_iter(stdout)
        .last()
        .ok_or_else(|| match pattern {
            None => "the workload printed no line COLOC_THROUGHPUT <value> <unit>".to_string(),
            Some(p) => format!("no line of the output matches the throughput regex {p:?}"),
        })?;
    let raw = captures.get(1).map(|m| m.as_str()).unwrap_or_default();
    let value: f64 = raw
        .parse()
        .map_err(|_| format!("the throughput {raw:?} is not a number"))?;
    if !value.is_finite() || value <= 0.0 {
        return Err(format!("the throughput {value} is not a positive number"));
    }
    let unit = captures
        .get(2)
        .map(|m| m.as_str().to_string())
        .unwrap_or_default();
    Ok((value, unit))
}

/// Finds a program given as a path, or as a name in PATH.
pub fn resolve_program(program: &str) -> Option<std::path::PathBuf> {
    let is_executable = |path: &std::path::Path| {
        use std::os::unix::fs::PermissionsExt;
        path.metadata()
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.contains('/') {
        let path = std::path::PathBuf::from(program);
        return is_executable(&path).then_some(path);
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(program))
            .find(|candidate| is_executable(candidate))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_throughput_line_and_a_custom_regex_are_parsed() {
        let out = "warming up\nCOLOC_THROUGHPUT 12.5 samples/s\nCOLOC_THROUGHPUT 13.25 samples/s\n";
        assert_eq!(
            parse_throughput(out, None).unwrap(),
            (13.25, "samples/s".into())
        );
        assert_eq!(
            parse_throughput("COLOC_THROUGHPUT 7\n", None).unwrap(),
            (7.0, String::new())
        );
        let custom = parse_throughput("step 100: 812.4 img/s", Some(r"([0-9.]+) (img/s)")).unwrap();
        assert_eq!(custom, (812.4, "img/s".into()));
    }

    #[test]
    fn missing_or_bad_throughput_lines_are_errors() {
        assert!(parse_throughput("nothing here", None).is_err());
        assert!(parse_throughput("COLOC_THROUGHPUT abc it/s", None).is_err());
        assert!(parse_throughput("COLOC_THROUGHPUT -3 it/s", None).is_err());
        assert!(parse_throughput("COLOC_THROUGHPUT 0 it/s", None).is_err());
        assert!(
            parse_throughput("xCOLOC_THROUGHPUT 5 it/s", None).is_err(),
            "must start a line"
        );
    }

    #[test]
    fn the_workload_environment_is_the_allow_list_plus_its_own_and_the_gpu() {
        let own = [("MY_FLAG".to_string(), "1".to_string())].into();
        let env = workload_environment(&["PATH".into(), "NOT_SET_ANYWHERE_X".into()], &own, 3);
        assert_eq!(
            env.get("CUDA_VISIBLE_DEVICES").map(String::as_str),
            Some("3")
        );
        assert_eq!(env.get("MY_FLAG").map(String::as_str), Some("1"));
        assert!(env.contains_key("PATH"));
        assert!(!env.contains_key("NOT_SET_ANYWHERE_X"));
        assert!(!env.contains_key("HOME") || std::env::var("HOME").is_ok());
    }
}
