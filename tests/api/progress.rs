//! Progress bars as a person meets them: drawn on a terminal (the command runs under
//! `script`, which gives it a pseudo-terminal), never in `--json` output, never when stderr
//! is a pipe.

use std::process::Command;

use tempfile::TempDir;

use crate::helpers::kace_dir;

/// Runs `command` under a pseudo-terminal; None when `script` (Debian's bsdutils, from
/// util-linux) is missing, a failure instead under CI.
fn on_a_terminal(command: &str) -> Option<String> {
    let output = Command::new("script")
        .args(["-qec", command, "/dev/null"])
        .env_remove("COLOC_NO_PROGRESS")
        .env("RUST_LOG", "warn")
        .output();
    match output {
        Ok(output) => {
            assert!(output.status.success(), "{command}: {output:?}");
            Some(String::from_utf8_lossy(&output.stdout).into_owned())
        }
        Err(e) => {
            crate::faults::unavailable(&format!(
                "`script` (bsdutils, from util-linux) is not available: {e}"
            ));
            None
        }
    }
}

fn bench(json: bool) -> String {
    format!(
        "{} bench --workloads 20 --observations 40 -c 1 --connections 1 -t 0.3 --warmup 0 \
         --scenarios health{}",
        env!("CARGO_BIN_EXE_coloc"),
        if json { " --json" } else { "" }
    )
}

#[test]
fn a_terminal_shows_a_progress_bar_and_json_output_does_not() {
    let Some(shown) = on_a_terminal(&bench(false)) else {
        return;
    };
    assert!(shown.contains("scenarios ["), "{shown}");
    let Some(json) = on_a_terminal(&bench(true)) else {
        return;
    };
    assert!(!json.contains("scenarios ["), "{json}");
    assert!(
        !json.contains('\u{1b}'),
        "no terminal codes in --json output: {json}"
    );
    let start = json.find('{').expect("a JSON report");
    serde_json::from_str::<serde_json::Value>(json[start..].trim()).expect("valid JSON");
}

#[test]
fn the_import_shows_its_progress_on_a_terminal_and_nothing_in_a_pipe() {
    let dir = TempDir::new().unwrap();
    let database = format!("sqlite://{}", dir.path().join("tty.db").display());
    let command = format!(
        "{} import kace {} --gpu 'Tesla V100-SXM2-32GB' --gpu-memory-gb 32 --database {database}",
        env!("CARGO_BIN_EXE_coloc"),
        kace_dir().display()
    );
    if let Some(shown) = on_a_terminal(&command) {
        assert!(shown.contains("workloads ["), "{shown}");
        assert!(shown.contains("training models"), "{shown}");
    }

    let piped_dir = TempDir::new().unwrap();
    let piped = Command::new(env!("CARGO_BIN_EXE_coloc"))
        .args(["import", "kace", kace_dir().to_str().unwrap()])
        .args(["--gpu", "Tesla V100-SXM2-32GB", "--gpu-memory-gb", "32"])
        .arg("--database")
        .arg(format!(
            "sqlite://{}",
            piped_dir.path().join("pipe.db").display()
        ))
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    assert!(piped.status.success(), "{piped:?}");
    let stderr = String::from_utf8_lossy(&piped.stderr);
    let stdout = String::from_utf8_lossy(&piped.stdout);
    assert!(
        !stderr.contains("workloads [") && !stderr.contains("training models"),
        "{stderr}"
    );
    assert!(stdout.contains("29 registered"), "{stdout}");
}
