//! Serving the champions the store names: on a server sharing its database with others, a
//! promotion or pin made by another server reaches this one when it reads the store's
//! champion of each GPU model (its pin, else its newest promoted model) and serves it
//! (`leader::follow` calls this every `leader.model_poll_ms`). The same for the catalog: a
//! workload registered, profiled or deleted through another server (or `coloc import`)
//! is served here once the store's catalog version moved and the profiles were read again.
//! And for what the stored runs say (evidence, suspect profiles): a training anywhere
//! reads the runs anew, and so does every replica once it sees that training's record.

use std::sync::Arc;

use super::{Advisor, Result};
use crate::{domain::GpuName, sync::Unpoisoned};

impl Advisor {
    /// Serves each GPU model's champion as the store names it, when it is not the version
    /// served now; returns the GPU models and versions that changed.
    /// A model published here while the store was read (a pin or promotion made through
    /// this server) wins: nothing is published this time, the next read sees it.
    pub async fn follow_store_champions(&self) -> Result<Vec<(GpuName, u64)>> {
        let before = *self.publications.lock().unpoisoned();
        let champions = self.store.champions().await?;
        let publications = self.publications.lock().unpoisoned();
        if *publications != before {
            return Ok(Vec::new());
        }
        let mut changed = Vec::new();
        for champion in champions {
            let served = self
                .models
                .load()
                .get(&champion.gpu)
                .map(|model| model.version);
            if served == Some(champion.version) {
                continue;
            }
            let gpu = champion.gpu.clone();
            let version = champion.version;
            tracing::info!(gpu = %gpu, version, was = ?served, "serving the store's champion");
            self.publish_held(&gpu, Arc::new(champion));
            changed.push((gpu, version));
        }
        Ok(changed)
    }

    /// Brings the catalog up to the store's workloads and profiles when the store's catalog
    /// version moved since the last call; returns the workloads put or removed.
    pub async fn follow_store_catalog(&self) -> Result<usize> {
        use std::sync::atomic::Ordering;
        // Local writers hold this across their store write and catalog change, so what is
        // read below is never older than what they put into memory.
        let _writer = self.catalog_writer.lock().await;
        let version = self.store.catalog_version().await?;
        if version == self.followed_catalog.load(Ordering::Acquire) {
            return Ok(0);
        }
        let gpus = self.store.gpus().await?;
        let stored = self.store.all_profiles().await?;
        let mut catalog = self.write_catalog();
        for (gpu, memory) in &gpus {
            catalog.set_gpu_memory(gpu, *memory);
        }
        let changed = catalog.sync(&stored);
        drop(catalog);
        self.followed_catalog.store(version, Ordering::Release);
        if changed > 0 {
            tracing::info!(changed, version, "catalog brought up to the store's");
        }
        Ok(changed)
    }

    /// Reads the stored runs of each GPU model again (evidence, suspect profiles) once a
    /// training run newer than the last one seen here was recorded, on any server; returns
    /// the GPU models read again.
    pub async fn follow_store_trainings(&self) -> Result<Vec<GpuName>> {
        let latest = self.store.latest_training_runs().await?;
        let mut refreshed = Vec::new();
        for (gpu, id) in latest {
            let seen = self
                .followed_trainings
                .lock()
                .unpoisoned()
                .get(&gpu)
                .copied();
            if seen == Some(id) {
                continue;
            }
            let runs = self
                .store
                .observations(&gpu, self.lifecycle.max_training_runs)
                .await?;
            self.refresh_runs(&gpu, &runs);
            self.followed_trainings
                .lock()
                .unpoisoned()
                .insert(gpu.clone(), id);
            refreshed.push(gpu);
        }
        Ok(refreshed)
    }
}
