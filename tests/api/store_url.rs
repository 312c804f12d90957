//! Which store the API tests run on. By default each test's server gets a fresh SQLite file
//! in its temporary folder. With `COLOC_TEST_STORE=postgres` it gets a fresh PostgreSQL
//! database instead, on the real server at `COLOC_TEST_POSTGRES` (default
//! `postgres://postgres@127.0.0.1:5432`, trust auth; `.ci/run` starts it): one database per
//! temporary folder (`coloc_t_<pid>_<n>`), created when a test first asks for its URL, so a
//! restart in the same folder finds the same data. A database is dropped when its test's
//! server goes away with the last handle on the folder, and whatever a run leaves behind
//! (a test that kept its folder, a process killed) is dropped by the next run: every
//! `coloc_t_` database of a process that no longer exists.
//!
//! Tests of SQLite's own file (faults made with chattr or a full tmpfs, `coloc backup` of
//! the file, damaged files, read-only connections) stay on SQLite; `.ci/run` skips them in
//! its PostgreSQL pass.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicU64, Ordering},
        Mutex, OnceLock,
    },
};

use sqlx::{Connection, Executor, PgConnection};

/// True when the tests run on PostgreSQL (`COLOC_TEST_STORE=postgres`).
pub fn on_postgres() -> bool {
    std::env::var("COLOC_TEST_STORE").is_ok_and(|store| store == "postgres")
}

fn server_url() -> String {
    std::env::var("COLOC_TEST_POSTGRES")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".to_string())
}

/// The databases created by this process, by folder.
fn databases() -> &'static Mutex<HashMap<PathBuf, String>> {
    static DATABASES: OnceLock<Mutex<HashMap<PathBuf, String>>> = OnceLock::new();
    DATABASES.get_or_init(Default::default)
}

/// Runs `work` on a connection to the server's `test` database, on a thread of its own
/// (callers may be inside a runtime, or in a `Drop`).
fn admin<T: Send + 'static>(
    work: impl FnOnce(&mut PgConnection) -> futures::future::BoxFuture<'_, T> + Send + 'static,
) -> T {
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async move {
                let url = format!("{}/test", server_url());
                let mut connection = PgConnection::connect(&url)
                    .await
                    .unwrap_or_else(|e| panic!("no PostgreSQL server at {url}: {e}"));
                let value = work(&mut connection).await;
                let _ = connection.close().await;
                value
            })
    })
    .join()
    .unwrap()
}

/// Drops the `coloc_t_` databases of processes that are gone (once per process).
fn sweep_leftovers() {
    static SWEPT: OnceLock<()> = OnceLock::new();
    SWEPT.get_or_init(|| {
        admin(|connection| {
            Box::pin(async move {
                let names: Vec<String> = sqlx::query_scalar(
                    "SELECT datname FROM pg_database WHERE datname LIKE 'coloc\\_t\\_%'",
                )
                .fetch_all(&mut *connection)
                .await
                .unwrap();
                for name in names {
                    let pid = name.split('_').nth(2).and_then(|p| p.parse::<u32>().ok());
                    let alive = pid.is_some_and(|pid| Path::new(&format!("/proc/{pid}")).exists());
                    if !alive {
                        let _ = connection
                            .execute(sqlx::AssertSqlSafe(format!(
                                "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
                            )))
                            .await;
                    }
                }
            })
        });
    });
}

/// The URL of the PostgreSQL database for `dir`, created the first time.
pub fn postgres_url(dir: &Path) -> String {
    let name = {
        let mut known = databases().lock().unwrap();
        if let Some(name) = known.get(dir) {
            return format!("{}/{name}", server_url());
        }
        sweep_leftovers();
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let name = format!("coloc_t_{}_{n}", std::process::id());
        known.insert(dir.to_path_buf(), name.clone());
        name
    };
    let create = name.clone();
    admin(move |connection| {
        Box::pin(async move {
            connection
                .execute(sqlx::AssertSqlSafe(format!("CREATE DATABASE {create}")))
                .await
                .unwrap();
        })
    });
    format!("{}/{name}", server_url())
}

/// Drops the database of `dir`, if one was created (its server must be gone).
pub fn drop_database(dir: &Path) {
    let Some(name) = databases().lock().unwrap().remove(dir) else {
        return;
    };
    admin(move |connection| {
        Box::pin(async move {
            let _ = connection
                .execute(sqlx::AssertSqlSafe(format!(
                    "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
                )))
                .await;
        })
    });
}

/// Dropped with a test's server: drops the folder's database when nobody holds the folder
/// any more (a folder handed back by `stop` may serve a restart).
#[derive(Debug)]
pub struct DatabaseGuard {
    pub dir: std::sync::Weak<tempfile::TempDir>,
    pub path: PathBuf,
}

impl Drop for DatabaseGuard {
    fn drop(&mut self) {
        if on_postgres() && self.dir.upgrade().is_none() {
            drop_database(&self.path);
        }
    }
}

/// One integer from the PostgreSQL database at `url`.
pub async fn query_i64(url: &str, sql: &str) -> i64 {
    let mut connection = PgConnection::connect(url).await.unwrap();
    let value = sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_string()))
        .fetch_one(&mut connection)
        .await
        .unwrap();
    let _ = connection.close().await;
    value
}

/// Every row of every table of the PostgreSQL database at `url`, as text, in a fixed order.
pub async fn dump(url: &str) -> String {
    let mut connection = PgConnection::connect(url).await.unwrap();
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT table_name::text FROM information_schema.tables \
         WHERE table_schema = current_schema() AND table_name <> 'leader_lease' \
         ORDER BY table_name",
    )
    .fetch_all(&mut connection)
    .await
    .unwrap();
    let mut dump = String::new();
    for table in tables {
        let rows: String = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT COALESCE(string_agg(t::text, ',' ORDER BY t::text), '') FROM \"{table}\" t"
        )))
        .fetch_one(&mut connection)
        .await
        .unwrap();
        dump.push_str(&format!("{table}: {rows}\n"));
    }
    let _ = connection.close().await;
    dump
}

/// A connection to the tests' store at `url`, whichever engine it is on (for reads the
/// tests make straight from the database, in portable SQL).
pub async fn connect(url: &str) -> sqlx::AnyConnection {
    sqlx::any::install_default_drivers();
    <sqlx::AnyConnection as Connection>::connect(url)
        .await
        .unwrap()
}
