//! The Python comparison peer (benches/peer/): started on the same synthetic data and
//! stopped when dropped.

use std::{
    io::{BufRead, BufReader},
    path::Path,
    process::{Child, Command, Stdio},
};

use anyhow::{bail, Context};

use super::{synthetic::Synthetic, BenchArgs, GPU_MEMORY_GB};

/// The Python comparison peer, stopped when dropped.
pub(super) struct Peer {
    pub(super) child: Child,
    pub(super) addr: String,
    pub(super) _dir: tempfile::TempDir,
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.child.wait();
    }
}

pub(super) fn start_peer(
    args: &BenchArgs,
    python: &Path,
    data: &Synthetic,
) -> anyhow::Result<Peer> {
    let dir = tempfile::tempdir()?;
    let profiles = dir.path().join("profiles.csv");
    let mut out = csv::Writer::from_path(&profiles)?;
    let mut header = vec!["workload"];
    header.extend(coloc::model::FEATURE_NAMES);
    out.write_record(&header)?;
    for (name, p) in data.names.iter().zip(&data.profiles) {
        let f = coloc::model::Features::of(p);
        let mut row = vec![name.to_string()];
        row.extend(f.0.iter().map(|v| format!("{v:?}")));
        out.write_record(&row)?;
    }
    out.flush()?;
    let observations = dir.path().join("observations.csv");
    let mut out = csv::Writer::from_path(&observations)?;
    out.write_record(["workload_a", "workload_b", "throughput_sum"])?;
    // The peer is KACE's pairwise model: it learns from the pairs alone.
    for run in data.runs.iter().filter(|run| run.members.len() == 2) {
        out.write_record([
            run.members[0].workload.to_string(),
            run.members[1].workload.to_string(),
            format!("{:?}", run.throughput_sum()),
        ])?;
    }
    out.flush()?;
    let mut child = Command::new(python)
        .arg(&args.peer_script)
        .arg("--proto-dir")
        .arg(&args.proto_dir)
        .arg("--profiles")
        .arg(&profiles)
        .arg("--observations")
        .arg(&observations)
        .args(["--port", "0", "--gpu-memory-gb", &GPU_MEMORY_GB.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot start the peer with {}", python.display()))?;
    let stdout = child.stdout.take().context("the peer's stdout")?;
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line)?;
    let Some(addr) = line.trim().strip_prefix("listening on ") else {
        let _ = child.kill();
        bail!("the peer did not start (its first line: {line:?})");
    };
    Ok(Peer {
        addr: format!("http://{addr}"),
        child,
        _dir: dir,
    })
}
