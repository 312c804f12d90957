//! A database file that is not what it should be: empty (a failed copy or restore) is
//! refused instead of opened as an empty store; a damaged one says so and how to check it.

use std::sync::Arc;

use coloc::{
    settings::{Settings, SettingsSources},
    startup::App,
};
use tempfile::TempDir;

use crate::helpers::{database_url, seed_workloads_and_runs, spawn_app_in, GPU};

async fn build_error(dir: &TempDir) -> String {
    let settings = Settings::load(SettingsSources {
        file: None,
        environment: Some(Default::default()),
        overrides: vec![
            ("server.listen", "127.0.0.1:0".into()),
            ("metrics.listen", "".into()),
            ("database.url", database_url(dir)),
        ],
    })
    .unwrap();
    match App::build(&settings).await {
        Ok(_) => panic!("the server started on a bad database file"),
        Err(error) => format!("{error:#}"),
    }
}

#[tokio::test]
async fn an_empty_database_file_is_refused_not_opened_as_an_empty_store() {
    let dir = TempDir::new().unwrap();
    std::fs::write(dir.path().join("coloc.db"), b"").unwrap();
    let error = build_error(&dir).await;
    assert!(error.contains("is empty (0 bytes)"), "{error}");
    assert_eq!(
        std::fs::metadata(dir.path().join("coloc.db"))
            .unwrap()
            .len(),
        0
    );
}

#[tokio::test]
async fn a_damaged_database_says_it_is_damaged_and_how_to_check_it() {
    let dir = Arc::new(TempDir::new().unwrap());
    let mut app = spawn_app_in(dir.clone()).await;
    seed_workloads_and_runs(&mut app, 6).await;
    app.client
        .train(coloc::proto::TrainRequest {
            gpu: GPU.into(),
            kind: String::new(),
        })
        .await
        .unwrap();
    let dir = app.stop().await;

    // A stored value that no longer decodes (what a damaged page gives).
    let mut connection = <sqlx::SqliteConnection as sqlx::Connection>::connect(&database_url(&dir))
        .await
        .unwrap();
    sqlx::query("UPDATE models SET parameters = CAST(X'7BFFFE7D' AS TEXT)")
        .execute(&mut connection)
        .await
        .unwrap();
    sqlx::Connection::close(connection).await.unwrap();
    let error = build_error(&dir).await;
    assert!(error.contains("is damaged"), "{error}");
    assert!(error.contains("integrity_check"), "{error}");

    // A file whose header is gone.
    let path = dir.path().join("coloc.db");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[..100].fill(0xAB);
    std::fs::write(&path, bytes).unwrap();
    let error = build_error(&dir).await;
    assert!(error.contains("is damaged"), "{error}");
}
