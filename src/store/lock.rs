//! Who owns a database file: a running `coloc serve` holds an exclusive advisory lock
//! (`flock`) on a sidecar file beside it (`<database>.lock`) for its whole life, so that tools that write the file directly
//! (`coloc import` without `--addr`) and a second server refuse it with a
//! clear message instead of writing behind the service's back (the service keeps profiles
//! and models in memory and would never see those writes). SQLite's own locks are
//! independent of this one and still guard each transaction.

use std::{fs::File, path::PathBuf, str::FromStr};

use nix::fcntl::{Flock, FlockArg};
use sqlx::sqlite::SqliteConnectOptions;

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error(
        "{0} is held by a running coloc serve; go through it (e.g. `coloc import kace DIR --addr \
         URL`) or stop it first"
    )]
    HeldByService(String),
    #[error("cannot open {0} to lock it")]
    Open(String, #[source] std::io::Error),
    #[error("cannot lock {0}: {1}")]
    Lock(String, nix::errno::Errno),
    #[error("invalid database url: {0}")]
    InvalidUrl(#[source] sqlx::Error),
}

/// An exclusive lock on a database file, released when dropped (or when the process dies).
#[derive(Debug)]
pub struct DatabaseLock {
    _lock: Option<Flock<File>>,
}

impl DatabaseLock {
    /// Takes the lock of the database at `url`, or says who holds it. In-memory databases
    /// have nothing to lock. The lock is a sidecar file (`<database>.lock`, created if
    /// missing), never the database itself: the store must still see a missing database as
    /// new and a zero-length one as suspicious.
    ///
    /// A PostgreSQL store has no file to lock and nothing is taken: several servers may
    /// share one database, and its write transactions take the database's own lock
    /// (`engine`).
    pub fn acquire(url: &str) -> Result<Self, LockError> {
        if super::engine::Engine::of_url(url) == super::engine::Engine::Postgres {
            return Ok(Self { _lock: None });
        }
        let options = SqliteConnectOptions::from_str(url).map_err(LockError::InvalidUrl)?;
        let path: PathBuf = options.get_filename().to_path_buf();
        let name = path.display().to_string();
        if url.contains(":memory:") || url.contains("mode=memory") || name.is_empty() {
            return Ok(Self { _lock: None });
        }
        let mut lock_path = path.clone().into_os_string();
        lock_path.push(".lock");
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&lock_path)
            .map_err(|e| LockError::Open(name.clone(), e))?;
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => Ok(Self { _lock: Some(lock) }),
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => Err(LockError::HeldByService(name)),
            Err((_, errno)) => Err(LockError::Lock(name, errno)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_is_refused_until_the_first_lets_go() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("coloc.db").display());
        let first = DatabaseLock::acquire(&url).unwrap();
        let error = DatabaseLock::acquire(&url).unwrap_err();
        assert!(matches!(error, LockError::HeldByService(_)), "{error}");
        assert!(error.to_string().contains("--addr"), "{error}");
        assert!(
            !dir.path().join("coloc.db").exists(),
            "the lock never creates the database file"
        );
        drop(first);
        DatabaseLock::acquire(&url).unwrap();
    }
}
