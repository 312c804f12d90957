//! A fresh PostgreSQL database per test, dropped when the test's handle goes.

use sqlx::{Connection, Executor, PgConnection};

fn server_url() -> String {
    std::env::var("COLOC_TEST_POSTGRES")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".to_string())
}

/// A database of its own for one test.
pub struct FreshDatabase {
    name: String,
    pub url: String,
}

impl FreshDatabase {
    /// A new database, or `None` (with a message) where no server answers outside CI.
    pub async fn create(tag: &str) -> Option<Self> {
        let admin_url = format!("{}/test", server_url());
        let mut admin = match PgConnection::connect(&admin_url).await {
            Ok(admin) => admin,
            Err(error) => {
                let message = format!("no PostgreSQL server at {admin_url} ({error})");
                if std::env::var_os("CI").is_some() {
                    panic!("{message}");
                }
                eprintln!("skipped: {message}");
                return None;
            }
        };
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let name = format!("coloc_replicas_{tag}_{}_{nanos}", std::process::id());
        admin
            .execute(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .await
            .unwrap();
        let url = format!("{}/{name}", server_url());
        Some(Self { name, url })
    }
}

impl Drop for FreshDatabase {
    fn drop(&mut self) {
        let (admin_url, name) = (format!("{}/test", server_url()), self.name.clone());
        // On a thread of its own: the test's runtime may be gone or busy.
        let _ = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(async move {
                    if let Ok(mut admin) = PgConnection::connect(&admin_url).await {
                        let _ = admin
                            .execute(sqlx::AssertSqlSafe(format!(
                                "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
                            )))
                            .await;
                    }
                })
        })
        .join();
    }
}
