//! A node's GPUs as coloc sees them: how many, which GPU model, and (optionally) their
//! memory. Read from the node's labels and capacity, most specific first:
//! `coloc.io/gpu-count` / `coloc.io/gpu-model` / `coloc.io/gpu-memory-gb` (the operator's
//! own labels), then NVIDIA GPU feature discovery's `nvidia.com/gpu.count` and
//! `nvidia.com/gpu.product`, then the `nvidia.com/gpu` capacity divided by
//! `nvidia.com/gpu.replicas` (time-slicing and MPS advertise each GPU that many times).
//! Without a memory label Place uses the memory coloc knows for the GPU model.

use k8s_openapi::api::core::v1::Node;

pub const GPU_COUNT_LABEL: &str = "coloc.io/gpu-count";
pub const GPU_MODEL_LABEL: &str = "coloc.io/gpu-model";
pub const GPU_MEMORY_LABEL: &str = "coloc.io/gpu-memory-gb";
pub const GFD_COUNT_LABEL: &str = "nvidia.com/gpu.count";
pub const GFD_PRODUCT_LABEL: &str = "nvidia.com/gpu.product";
pub const GFD_REPLICAS_LABEL: &str = "nvidia.com/gpu.replicas";
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";

/// The GPUs of one node (kept in the one cluster view).
pub use crate::cluster::NodeGpus;

/// The node's GPUs; `None` when it has none coloc can see.
pub fn node_gpus(node: &Node) -> Option<NodeGpus> {
    let labels = node.metadata.labels.as_ref();
    let label = |key: &str| {
        labels
            .and_then(|l| l.get(key))
            .map(|v| v.trim())
            .filter(|v| !v.is_empty())
    };
    let count = label(GPU_COUNT_LABEL)
        .or_else(|| label(GFD_COUNT_LABEL))
        .and_then(|v| v.parse::<u32>().ok())
        .or_else(|| {
            let status = node.status.as_ref()?;
            let advertised = status
                .capacity
                .as_ref()
                .or(status.allocatable.as_ref())?
                .get(GPU_RESOURCE)?
                .0
                .parse::<u32>()
                .ok()?;
            let replicas = label(GFD_REPLICAS_LABEL)
                .and_then(|v| v.parse::<u32>().ok())
                .filter(|r| *r > 0)
                .unwrap_or(1);
            Some(advertised / replicas)
        })
        .filter(|count| *count > 0)?;
    Some(NodeGpus {
        count,
        gpu_model: label(GPU_MODEL_LABEL)
            .or_else(|| label(GFD_PRODUCT_LABEL))
            .map(str::to_string),
        memory_gb: label(GPU_MEMORY_LABEL)
            .and_then(|v| v.parse::<f64>().ok())
            .filter(|m| *m > 0.0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(json: serde_json::Value) -> Node {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn time_sliced_capacity_is_divided_by_the_replicas() {
        let n = node(serde_json::json!({
            "metadata": {"name": "n", "labels": {
                "nvidia.com/gpu.product": "Tesla-V100-SXM2-32GB", "nvidia.com/gpu.replicas": "4"}},
            "status": {"capacity": {"nvidia.com/gpu": "32"}}
        }));
        let gpus = node_gpus(&n).unwrap();
        assert_eq!(gpus.count, 8);
        assert_eq!(gpus.gpu_model.as_deref(), Some("Tesla-V100-SXM2-32GB"));
    }

    #[test]
    fn a_node_without_gpus_has_none() {
        let n = node(serde_json::json!({
            "metadata": {"name": "cpu"}, "status": {"capacity": {"cpu": "64"}}}));
        assert_eq!(node_gpus(&n), None);
    }
}
