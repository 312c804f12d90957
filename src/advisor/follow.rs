//! Serving the champions the store names: on a server sharing its database with others, a
//! promotion or pin made by another server reaches this one when it reads the store's
//! champion of each GPU model (its pin, else its newest promoted model) and serves it
//! (`leader::follow` calls this every `leader.model_poll_ms`).

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
}
