//! What the observer reads of the catalog: a workload's exclusive throughput on a GPU
//! model, the one solo windows are compared with (drift).

use super::Advisor;
use crate::domain::{GpuName, WorkloadName};

impl Advisor {
    /// The exclusive throughput predictions use for `workload` on `gpu` (its profile's, or
    /// the corrected one of a suspect profile); `None` when it has no profile there.
    pub fn exclusive_throughput(&self, gpu: &GpuName, workload: &WorkloadName) -> Option<f64> {
        let catalog = self.read_catalog();
        let table = catalog.gpu(gpu)?;
        table.get(workload).map(|entry| entry.exclusive())
    }
}
