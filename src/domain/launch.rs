//! How the profiling worker runs a workload: a program with arguments and environment,
//! never through a shell, and how the workload reports its throughput.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::ValidationError;

/// The NVTX range the example workloads put around one step; ncu profiles only that range.
pub const DEFAULT_NVTX_RANGE: &str = "coloc_step";
const MAX_ARGS: usize = 256;
const MAX_ARG_CHARS: usize = 4096;
const MAX_ENV: usize = 128;
const MAX_TIMEOUT_SECS: u32 = 24 * 3600;
const MAX_IMAGE_CHARS: usize = 512;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaunchSpec {
    /// Absolute path of the program; it must match `profiler.allowed_programs`.
    pub program: String,
    pub args: Vec<String>,
    /// Set on top of the allow-listed part of the worker's own environment.
    pub env: BTreeMap<String, String>,
    /// Absolute; `None` = the worker's working directory.
    pub working_dir: Option<String>,
    /// Limit for each run (system phase, kernel phase); `None` = the worker's settings.
    pub timeout_secs: Option<u32>,
    /// A regex with a capture group for the value (and optionally a second for the unit)
    /// that finds the throughput in the workload's stdout; `None` = the line
    /// `COLOC_THROUGHPUT <value> <unit>`.
    pub throughput_regex: Option<String>,
    /// NVTX range that marks one step for Nsight Compute; `None` = `coloc_step`; an empty
    /// string = select kernels by launch count instead (profiler settings).
    pub nvtx_range: Option<String>,
    /// The workload's container image, for profiling in a Kubernetes Job
    /// (`profiler.dispatch = "kubernetes-jobs"`): the program runs in it, measured by
    /// coloc; `None` = the workload can be profiled only by the worker or an agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
}

fn is_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

impl LaunchSpec {
    pub fn validate(&self) -> Result<(), ValidationError> {
        let invalid = |m: String| {
            // Every message starts with the field it is about.
            let field = m.split_whitespace().next().unwrap_or("launch").to_string();
            Err(ValidationError::new(field, m))
        };
        if !self.program.starts_with('/') || self.program.contains('\0') {
            return invalid(format!(
                "launch.program must be an absolute path, got {:?}",
                self.program
            ));
        }
        if self.args.len() > MAX_ARGS {
            return invalid(format!("launch.args has more than {MAX_ARGS} arguments"));
        }
        if self
            .args
            .iter()
            .any(|a| a.contains('\0') || a.chars().count() > MAX_ARG_CHARS)
        {
            return invalid(format!(
                "launch.args must not contain NUL or arguments over {MAX_ARG_CHARS} characters"
            ));
        }
        if self.env.len() > MAX_ENV {
            return invalid(format!("launch.env has more than {MAX_ENV} variables"));
        }
        if let Some((bad, _)) = self
            .env
            .iter()
            .find(|(k, v)| !is_env_name(k) || v.contains('\0'))
        {
            return invalid(format!("launch.env has an invalid variable {bad:?}"));
        }
        if self.env.contains_key("CUDA_VISIBLE_DEVICES") {
            return invalid(
                "launch.env must not set CUDA_VISIBLE_DEVICES: the worker picks the GPU".into(),
            );
        }
        if let Some(dir) = &self.working_dir {
            if !dir.starts_with('/') || dir.contains('\0') {
                return invalid(format!("launch.working_dir must be absolute, got {dir:?}"));
            }
        }
        if let Some(timeout) = self.timeout_secs {
            if timeout == 0 || timeout > MAX_TIMEOUT_SECS {
                return invalid(format!(
                    "launch.timeout_secs must be between 1 and {MAX_TIMEOUT_SECS}, got {timeout}"
                ));
            }
        }
        if let Some(pattern) = &self.throughput_regex {
            let regex = regex::Regex::new(pattern).map_err(|e| {
                ValidationError::new(
                    "launch.throughput_regex",
                    format!("launch.throughput_regex does not compile: {e}"),
                )
            })?;
            if regex.captures_len() < 2 {
                return invalid(
                    "launch.throughput_regex needs a capture group for the value".into(),
                );
            }
        }
        if let Some(image) = &self.image {
            if image.is_empty()
                || image.len() > MAX_IMAGE_CHARS
                || image.chars().any(|c| c.is_whitespace() || c.is_control())
            {
                return invalid(format!(
                    "launch.image must be an image reference of 1 to {MAX_IMAGE_CHARS} \
                     characters without spaces, got {image:?}"
                ));
            }
        }
        if let Some(range) = &self.nvtx_range {
            if range.chars().count() > 256 || range.chars().any(char::is_control) {
                return invalid(
                    "launch.nvtx_range must be at most 256 printable characters".into(),
                );
            }
        }
        Ok(())
    }
}

/// The programs an operator lets launch specs run (`profiler.allowed_programs`): glob
/// patterns over absolute paths. A program is checked as the file it really is: a path
/// with a `..` component is refused, the path is resolved (symlinks followed, the file
/// must exist), and the resolved path must match a pattern component by component (`*`
/// and `?` never cross a `/`; `**` as a whole component matches any folders). Checked at
/// registration and again right before each launch, which runs the resolved path.
#[derive(Debug, Clone, Default)]
pub struct AllowedPrograms {
    patterns: Vec<glob::Pattern>,
}

const MATCH: glob::MatchOptions = glob::MatchOptions {
    case_sensitive: true,
    require_literal_separator: true,
    require_literal_leading_dot: false,
};

fn has_parent_component(path: &str) -> bool {
    std::path::Path::new(path)
        .components()
        .any(|c| c == std::path::Component::ParentDir)
}

impl AllowedPrograms {
    /// Compiles the patterns; each must be an absolute path pattern without `..`.
    pub fn new(patterns: &[String]) -> Result<Self, String> {
        let patterns = patterns
            .iter()
            .map(|p| {
                if !p.starts_with('/') {
                    return Err(format!("{p:?} is not an absolute path pattern"));
                }
                if has_parent_component(p) {
                    return Err(format!("{p:?} must not contain a `..` component"));
                }
                glob::Pattern::new(p).map_err(|e| format!("{p:?}: {e}"))
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { patterns })
    }

    /// True when no program is allowed (launch specs are refused).
    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }

    /// The resolved path of `program` when it is allowed, or why it is not.
    pub fn resolve(&self, program: &str) -> Result<std::path::PathBuf, String> {
        if !program.starts_with('/') {
            return Err("it is not an absolute path".into());
        }
        if has_parent_component(program) {
            return Err("it has a `..` component".into());
        }
        let resolved = std::fs::canonicalize(program)
            .map_err(|e| format!("it cannot be resolved on this server ({e})"))?;
        if !resolved.is_file() {
            return Err(format!("{} is not a file", resolved.display()));
        }
        let text = resolved
            .to_str()
            .ok_or_else(|| format!("{} is not UTF-8", resolved.display()))?;
        if self.patterns.iter().any(|p| p.matches_with(text, MATCH)) {
            Ok(resolved)
        } else if text == program {
            Err("it matches no pattern".into())
        } else {
            Err(format!("it resolves to {text}, which matches no pattern"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub fn spec() -> LaunchSpec {
        LaunchSpec {
            program: "/usr/bin/python3".into(),
            args: vec!["train.py".into(), "--steps".into(), "100".into()],
            env: [("OMP_NUM_THREADS".to_string(), "4".to_string())].into(),
            working_dir: Some("/srv/jobs".into()),
            timeout_secs: Some(600),
            throughput_regex: Some(r"throughput: ([0-9.]+) (\S+)".into()),
            nvtx_range: None,
            image: None,
        }
    }

    #[test]
    fn a_complete_spec_is_valid() {
        spec().validate().unwrap();
    }

    #[test]
    fn relative_programs_bad_env_bad_regex_and_bad_timeouts_are_rejected() {
        type Mutation = fn(&mut LaunchSpec);
        let cases: [(&str, Mutation); 7] = [
            ("relative program", |s| s.program = "python3".into()),
            ("env name", |s| {
                s.env.insert("BAD-NAME".into(), "x".into());
            }),
            ("gpu choice", |s| {
                s.env.insert("CUDA_VISIBLE_DEVICES".into(), "1".into());
            }),
            ("relative dir", |s| s.working_dir = Some("jobs".into())),
            ("zero timeout", |s| s.timeout_secs = Some(0)),
            ("regex", |s| s.throughput_regex = Some("(".into())),
            ("no group", |s| {
                s.throughput_regex = Some("throughput".into())
            }),
        ];
        for (what, mutate) in cases {
            let mut s = spec();
            mutate(&mut s);
            assert!(s.validate().is_err(), "{what} accepted");
        }
    }

    #[test]
    fn allowed_programs_are_resolved_and_matched_component_by_component() {
        let dir = tempfile::TempDir::new().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        let jobs = root.join("jobs");
        std::fs::create_dir_all(jobs.join("a/b")).unwrap();
        std::fs::write(jobs.join("train.sh"), "").unwrap();
        std::fs::write(jobs.join("a/b/c"), "").unwrap();
        std::fs::write(root.join("outside"), "").unwrap();
        std::os::unix::fs::symlink(root.join("outside"), jobs.join("sh")).unwrap();
        std::os::unix::fs::symlink(jobs.join("train.sh"), jobs.join("alias")).unwrap();
        let allowed = AllowedPrograms::new(&[format!("{}/*", jobs.display())]).unwrap();
        let path = |p: &str| format!("{}/{p}", jobs.display());

        assert_eq!(
            allowed.resolve(&path("train.sh")).unwrap(),
            jobs.join("train.sh")
        );
        // A symlink to an allowed file runs that file.
        assert_eq!(
            allowed.resolve(&path("alias")).unwrap(),
            jobs.join("train.sh")
        );
        for (escape, why) in [
            (path("../outside"), "`..`"),
            (path("../../../../bin/sh"), "`..`"),
            (path("sh"), "resolves to"),
            (path("a/b/c"), "matches no pattern"),
            (path("missing"), "cannot be resolved"),
            (path("a"), "not a file"),
        ] {
            let refused = allowed.resolve(&escape).unwrap_err();
            assert!(refused.contains(why), "{escape}: {refused}");
        }
        assert!(AllowedPrograms::new(&["/opt/../bin/*".into()]).is_err());
        assert!(AllowedPrograms::new(&["bin/*".into()]).is_err());
    }
}
