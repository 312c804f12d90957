//! Advice that binds: how the GPU coloc picks becomes the GPU the pod gets
//! (`extender.binding`). `node-only` scores nodes and leaves the GPU to the device plugin;
//! `hami` and `dra` add a mutating admission webhook (`webhook`) on the extender's HTTP
//! server that decides over every GPU of the cluster (`inventory`, kept from HAMi's node
//! annotation or the DRA driver's ResourceSlices) and holds the chosen slot in the store
//! until the pod lands (`choose`, over `store::reservations`); under HAMi only GPUs HAMi's
//! own accounting will accept are named (`hami`), under DRA only devices the allocator can
//! still give the claim (`dra` reads where allocated claims run, `claims` watches them
//! into the cluster view). docs/stacks/ says what each mode controls.

pub mod choose;
pub mod claims;
pub mod dra;
pub mod hami;
pub mod inventory;
mod kept;
pub mod webhook;

pub use choose::{Ask, Choice, Chooser, NoChoice};
pub use inventory::{Device, Inventory};
pub use webhook::Webhook;

use std::{sync::Arc, time::Duration};

use axum::Router;

use super::{cluster::ClusterView, decide::Placer, http::ServeOptions};
use crate::{
    settings::{BindingMode, ExtenderSettings},
    store::reservations::Reservations,
};

/// The binding settings the service starts the webhook with.
#[derive(Debug, Clone, PartialEq)]
pub struct BindingOptions {
    pub mode: BindingMode,
    pub gpus: usize,
    pub ttl: Duration,
}

impl BindingOptions {
    pub fn from_settings(extender: &ExtenderSettings) -> Self {
        Self {
            mode: extender.binding,
            gpus: extender.binding_gpus,
            ttl: Duration::from_secs(extender.reservation_ttl_secs),
        }
    }

    /// The webhook's routes for the extender's server; `None` in `node-only` mode.
    pub fn routes(
        &self,
        placer: Arc<dyn Placer>,
        cluster: Arc<ClusterView>,
        inventory: Arc<Inventory>,
        pool: sqlx::AnyPool,
        options: &ServeOptions,
    ) -> Option<Router> {
        if self.mode == BindingMode::NodeOnly {
            return None;
        }
        let chooser = Chooser::new(
            placer,
            cluster,
            inventory,
            Reservations::Store(pool),
            self.ttl,
            self.gpus,
        );
        tracing::info!(
            mode = self.mode.as_str(),
            "binding webhook on <prefix>/mutate"
        );
        Some(webhook::router(
            Arc::new(Webhook::new(self.mode, chooser)),
            &options.url_prefix,
            options.max_request_bytes,
        ))
    }
}
