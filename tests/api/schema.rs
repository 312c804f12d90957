//! The PostgreSQL schema (migrations/postgres) against the SQLite one (migrations/): applied
//! to a fresh database on the real PostgreSQL server (127.0.0.1:5432, database `test` for
//! the administration, trust auth), it must name the same tables and columns, with the same
//! types (INTEGER as BIGINT, REAL as DOUBLE PRECISION, TEXT) and nullability, and enforce the
//! same checks. Skipped (with a message) where no PostgreSQL server answers, except under
//! CI, where that fails (`.ci/run` starts it).

use std::collections::BTreeMap;

use sqlx::{Connection, Executor, PgConnection};

use crate::faults::unavailable;

/// The administration database of the shared server.
const ADMIN_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// A database created for one test, dropped by [`FreshDatabase::drop_now`].
pub(crate) struct FreshDatabase {
    pub(crate) name: String,
    pub(crate) url: String,
}

impl FreshDatabase {
    pub(crate) async fn create() -> Option<Self> {
        let mut admin = match PgConnection::connect(ADMIN_URL).await {
            Ok(admin) => admin,
            Err(error) => {
                unavailable(&format!("no PostgreSQL server at {ADMIN_URL} ({error})"));
                return None;
            }
        };
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let name = format!("coloc_test_{}_{nanos}", std::process::id());
        admin
            .execute(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .await
            .unwrap();
        let url = format!("postgres://postgres@127.0.0.1:5432/{name}");
        Some(Self { name, url })
    }

    pub(crate) async fn drop_now(self) {
        let mut admin = PgConnection::connect(ADMIN_URL).await.unwrap();
        admin
            .execute(sqlx::AssertSqlSafe(format!(
                "DROP DATABASE {} WITH (FORCE)",
                self.name
            )))
            .await
            .unwrap();
    }
}

/// (table, column) -> (type, not null), in PostgreSQL's words.
type Columns = BTreeMap<(String, String), (String, bool)>;

async fn sqlite_columns() -> Columns {
    let dir = tempfile::TempDir::new().unwrap();
    let url = format!("sqlite://{}", dir.path().join("coloc.db").display());
    let store = coloc::store::Store::open(&url).await.unwrap();
    let rows: Vec<(String, String, String, i64, i64)> = sqlx::query_as(
        "SELECT m.name, p.name, p.type, p.\"notnull\", p.pk FROM sqlite_master m, \
         pragma_table_info(m.name) p \
         WHERE m.type = 'table' AND m.name NOT LIKE 'sqlite_%' AND m.name <> '_sqlx_migrations'",
    )
    .fetch_all(store.pool())
    .await
    .unwrap();
    store.close().await;
    rows.into_iter()
        .map(|(table, column, kind, not_null, pk)| {
            let kind = match kind.as_str() {
                "INTEGER" | "BIGINT" => "bigint",
                "REAL" => "double precision",
                "TEXT" => "text",
                other => panic!("{table}.{column}: SQLite type {other}"),
            };
            // A primary key column is never NULL, whatever SQLite's pragma says.
            ((table, column), (kind.to_string(), not_null == 1 || pk > 0))
        })
        .collect()
}

async fn postgres_columns(pool: &sqlx::PgPool) -> Columns {
    let rows: Vec<(String, String, String, String)> = sqlx::query_as(
        "SELECT table_name::text, column_name::text, data_type::text, is_nullable::text \
         FROM information_schema.columns \
         WHERE table_schema = 'public' AND table_name <> '_sqlx_migrations'",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    rows.into_iter()
        .map(|(table, column, kind, nullable)| ((table, column), (kind, nullable == "NO")))
        .collect()
}

#[tokio::test]
async fn the_postgres_schema_matches_the_sqlite_one() {
    let Some(database) = FreshDatabase::create().await else {
        return;
    };
    // In a task of its own, so that the database is dropped also when a check fails.
    let checked = tokio::spawn(check_schema(database.url.clone())).await;
    database.drop_now().await;
    if let Err(failed) = checked {
        std::panic::resume_unwind(failed.into_panic());
    }
}

async fn check_schema(url: String) {
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    sqlx::migrate!("migrations/postgres")
        .run(&pool)
        .await
        .unwrap();
    let postgres = postgres_columns(&pool).await;
    let sqlite = sqlite_columns().await;
    let only = |a: &Columns, b: &Columns| -> Vec<String> {
        a.iter()
            .filter(|(key, value)| b.get(*key) != Some(*value))
            .map(|((table, column), (kind, not_null))| {
                format!("{table}.{column} {kind} not null {not_null}")
            })
            .collect()
    };
    assert_eq!(
        (only(&sqlite, &postgres), only(&postgres, &sqlite)),
        (Vec::new(), Vec::new()),
        "(SQLite's columns unlike PostgreSQL's, PostgreSQL's unlike SQLite's)"
    );
    assert!(sqlite.len() > 100, "{} columns", sqlite.len());

    // The checks hold there too: a negative throughput is refused, a valid row is not.
    let observation: i64 = sqlx::query_scalar(
        "INSERT INTO observations (gpu, observed_at_ms, recorded_at_ms, source, fingerprint) \
         VALUES ('g', 1, 1, 'reported', 'f') RETURNING id",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let insert_member = |throughput: f64| {
        sqlx::query(
            "INSERT INTO observation_members (observation_id, position, workload, throughput) \
             VALUES ($1, $2, 'a', $3)",
        )
        .bind(observation)
        .bind(if throughput < 0.0 { 1_i64 } else { 0 })
        .bind(throughput)
    };
    insert_member(1.0).execute(&pool).await.unwrap();
    let refused = insert_member(-1.0).execute(&pool).await.unwrap_err();
    assert_eq!(
        refused.as_database_error().map(|e| e.kind()),
        Some(sqlx::error::ErrorKind::CheckViolation),
        "{refused}"
    );
    let version: i64 = sqlx::query_scalar("SELECT version FROM occupancy_version WHERE id = 1")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(version, 0);
    pool.close().await;
}
