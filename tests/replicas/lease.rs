//! The lease and the fencing token through the store's API, on a SQLite file and on
//! PostgreSQL: the same SQL path on both.

use std::time::Duration;

use coloc::{
    domain::GpuName,
    store::{
        lease::{fenced, Fence, LeaseOutcome},
        Store, StoreError,
    },
};

use crate::pg::FreshDatabase;

async fn training_runs(store: &Store) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM training_runs")
        .fetch_one(store.pool())
        .await
        .unwrap()
}

/// A leader-only write: one training run recorded inside `fence`.
async fn leader_write(store: &Store, fence: &Fence) -> Result<(), StoreError> {
    let gpu = GpuName::parse("gpu", "H100").unwrap();
    fenced(
        fence.clone(),
        store.record_training_run(
            &gpu,
            "member-ridge-gbt",
            "schedule",
            "promoted",
            None,
            "",
            0,
        ),
    )
    .await
}

/// Two servers ("a", "b") on one store: one leads at a time, the token grows at each
/// change of holder, and a deposed leader's write is refused with nothing written.
async fn one_leader_at_a_time(url: &str) {
    let a = Store::open(url).await.unwrap();
    let b = Store::open(url).await.unwrap();
    let ttl_ms = 600;
    let held = a.take_or_renew_lease("a", ttl_ms).await.unwrap();
    let LeaseOutcome::Held {
        token: first,
        taken: true,
        ..
    } = held
    else {
        panic!("a takes the free lease: {held:?}");
    };
    match b.take_or_renew_lease("b", ttl_ms).await.unwrap() {
        LeaseOutcome::HeldBy {
            holder,
            token,
            expires_in_ms,
        } => {
            assert_eq!((holder.as_str(), token), ("a", first));
            assert!(
                expires_in_ms > 0 && expires_in_ms <= ttl_ms,
                "{expires_in_ms}"
            );
        }
        other => panic!("b must not take a's live lease: {other:?}"),
    }
    // Renewing keeps the token.
    let renewed = a.take_or_renew_lease("a", ttl_ms).await.unwrap();
    assert!(
        matches!(renewed, LeaseOutcome::Held { token, taken: false, .. } if token == first),
        "{renewed:?}"
    );
    let fence_a = Fence {
        holder: "a".into(),
        token: first,
    };
    leader_write(&a, &fence_a).await.unwrap();
    assert_eq!(training_runs(&a).await, 1);

    // a stops renewing: after the term, b takes the lease with the next token.
    tokio::time::sleep(Duration::from_millis(ttl_ms as u64 + 200)).await;
    let expired = leader_write(&a, &fence_a).await.unwrap_err();
    assert!(matches!(expired, StoreError::NotLeader { .. }), "{expired}");
    assert!(expired.to_string().contains("ran out"), "{expired}");
    let taken = b.take_or_renew_lease("b", 10_000).await.unwrap();
    let LeaseOutcome::Held {
        token: second,
        taken: true,
        ..
    } = taken
    else {
        panic!("b takes the expired lease: {taken:?}");
    };
    assert_eq!(second, first + 1, "a new holder, a new token");

    // a's late write (its old token) is refused, nothing written; b's goes through.
    let refused = leader_write(&a, &fence_a).await.unwrap_err();
    match &refused {
        StoreError::NotLeader { holder, token, now } => {
            assert_eq!((holder.as_str(), *token), ("a", first));
            assert!(now.contains("b leads with token"), "{now}");
        }
        other => panic!("a deposed leader's write must fail as NotLeader: {other}"),
    }
    assert_eq!(training_runs(&a).await, 1, "the refused write left nothing");
    let fence_b = Fence {
        holder: "b".into(),
        token: second,
    };
    leader_write(&b, &fence_b).await.unwrap();
    assert_eq!(training_runs(&b).await, 2);
    // a cannot take the lease back while b's is live; writes outside a fence are not checked.
    assert!(matches!(
        a.take_or_renew_lease("a", ttl_ms).await.unwrap(),
        LeaseOutcome::HeldBy { .. }
    ));
    let gpu = GpuName::parse("gpu", "H100").unwrap();
    a.record_training_run(&gpu, "member-ridge-gbt", "manual", "promoted", None, "", 0)
        .await
        .unwrap();

    // Letting go: a is refused (not its lease), b's release lets a take it at once.
    assert!(!a.release_lease(&fence_a).await.unwrap());
    assert!(b.release_lease(&fence_b).await.unwrap());
    let retaken = a.take_or_renew_lease("a", ttl_ms).await.unwrap();
    assert!(
        matches!(retaken, LeaseOutcome::Held { token, taken: true, .. } if token == second + 1),
        "{retaken:?}"
    );
    let (row, _) = a.lease().await.unwrap();
    assert_eq!(row.unwrap().holder, "a");
    a.close().await;
    b.close().await;
}

#[tokio::test]
async fn one_leader_at_a_time_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("coloc.db").display());
    one_leader_at_a_time(&url).await;
}

#[tokio::test]
async fn one_leader_at_a_time_on_postgres() {
    let Some(database) = FreshDatabase::create("lease").await else {
        return;
    };
    one_leader_at_a_time(&database.url).await;
}

/// Servers racing for a free lease on PostgreSQL: exactly one takes it.
#[tokio::test]
async fn racing_servers_elect_one_leader_on_postgres() {
    let Some(database) = FreshDatabase::create("race").await else {
        return;
    };
    let mut stores = Vec::new();
    for _ in 0..6 {
        stores.push(Store::open(&database.url).await.unwrap());
    }
    let tries = stores.iter().enumerate().map(|(n, store)| async move {
        store
            .take_or_renew_lease(&format!("s{n}"), 5_000)
            .await
            .unwrap()
    });
    let outcomes = futures::future::join_all(tries).await;
    let held = outcomes
        .iter()
        .filter(|o| matches!(o, LeaseOutcome::Held { .. }))
        .count();
    assert_eq!(held, 1, "{outcomes:?}");
    for store in stores {
        store.close().await;
    }
}
