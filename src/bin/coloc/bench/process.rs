//! What a process costs while it is measured: resident memory and CPU seconds, read from
//! /proc (this process, or the Python peer's).

pub(super) fn rss_mb() -> Option<f64> {
    status_mb("VmRSS:")
}

/// The largest resident memory this process has had so far.
pub(super) fn peak_rss_mb() -> Option<f64> {
    status_mb("VmHWM:")
}

fn status_mb(field: &str) -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

/// CPU seconds (user + system) used so far by a process (`None` = this one).
pub(super) fn cpu_seconds(pid: Option<u32>) -> f64 {
    let path = match pid {
        Some(pid) => format!("/proc/{pid}/stat"),
        None => "/proc/self/stat".into(),
    };
    let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64;
    std::fs::read_to_string(path)
        .ok()
        .and_then(|stat| {
            // Fields after the command name (which may hold spaces) start at field 3.
            let rest = &stat[stat.rfind(')')? + 2..];
            let fields: Vec<&str> = rest.split_whitespace().collect();
            let utime: f64 = fields.get(11)?.parse().ok()?;
            let stime: f64 = fields.get(12)?.parse().ok()?;
            Some((utime + stime) / ticks)
        })
        .unwrap_or(0.0)
}
