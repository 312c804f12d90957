//! HAMi's own accounting of a GPU, so that the webhook names only GPUs HAMi will accept.
//! HAMi's scheduler refuses a device its NVIDIA `Fit` finds short (Project-HAMi/HAMi
//! pkg/device/nvidia/device.go): the split count used up (`Count <= Used`), less free
//! memory than the request (`Totalmem - Usedmem < memreq`), fewer free cores
//! (`Totalcore - Usedcores < Coresreq`), a whole-card request (cores 100) on a card in
//! use, or a core-less request on a card whose cores are all taken. Its inputs, read here
//! as HAMi reads them:
//!
//! - the capacity: each device of the node's `hami.io/node-nvidia-register` annotation,
//!   `count` (the split count), `devmem` (MiB) and `devcore` (percent), as its device
//!   plugin registers them (`DeviceInfo`, pkg/device/devices.go);
//! - the use: every bound pod's `hami.io/vgpu-devices-allocated` (`UUID,TYPE,MEM,CORES:`
//!   per device, `;` after each container; `EncodePodSingleDevice`, pkg/device/devices.go),
//!   one use per device listed, whatever the pod runs;
//! - the request: each container's `nvidia.com/gpu`, `nvidia.com/gpumem` (MiB),
//!   `nvidia.com/gpumem-percentage` and `nvidia.com/gpucores`, limits before requests
//!   (`GenerateResourceRequests`, device.go, with the chart's default resource names, no
//!   default memory or cores and memory factor 1); cores above 100 count as 100, and a
//!   container asking for a GPU with neither cores nor a memory size gets the whole card
//!   (cores 100, memory 100 %), as HAMi's own admission webhook sets it
//!   (`defaultExclusiveCoreIfNeeded`, device.go).
//!
//! MIG devices and HAMi's namespace quotas (`fitQuota`) are not modelled: a MIG device is
//! judged as a whole card, and a pod over its namespace's quota is refused by HAMi whatever
//! GPU it is sent to.

use k8s_openapi::{api::core::v1::Pod, apimachinery::pkg::api::resource::Quantity};

pub use crate::cluster::HamiAllocation;

pub const GPU_RESOURCE: &str = "nvidia.com/gpu";
pub const GPU_MEMORY_RESOURCE: &str = "nvidia.com/gpumem";
pub const GPU_MEMORY_PERCENTAGE_RESOURCE: &str = "nvidia.com/gpumem-percentage";
pub const GPU_CORES_RESOURCE: &str = "nvidia.com/gpucores";

/// A device as HAMi registers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    /// The split count: how many containers may share it.
    pub count: u32,
    pub mem_mib: i64,
    pub cores: i64,
}

/// What HAMi counts as used on one device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Use {
    pub containers: u32,
    pub mem_mib: i64,
    pub cores: i64,
}

impl Use {
    /// Counts one more container on the device.
    pub fn add(&mut self, mem_mib: i64, cores: i64) {
        self.containers += 1;
        self.mem_mib += mem_mib;
        self.cores += cores;
    }
}

/// One GPU-requesting container's ask, as HAMi reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// `nvidia.com/gpumem` in MiB; 0 when the container gives none.
    pub mem_mib: i64,
    /// `nvidia.com/gpumem-percentage`, used when no memory size is given.
    pub mem_percent: i64,
    pub cores: i64,
}

impl Request {
    /// The memory it takes on a device of `total` MiB (HAMi's `memreq`).
    pub fn mem_on(&self, total: i64) -> i64 {
        if self.mem_mib > 0 {
            self.mem_mib
        } else {
            total * self.mem_percent / 100
        }
    }
}

/// Why HAMi would refuse a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    SplitCountUsedUp,
    Memory,
    Cores,
    ExclusiveOnUsedCard,
    CoresExhausted,
}

impl Refusal {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::SplitCountUsedUp => "split count used up",
            Self::Memory => "insufficient memory",
            Self::Cores => "insufficient cores",
            Self::ExclusiveOnUsedCard => "whole-card request on a card in use",
            Self::CoresExhausted => "cores exhausted",
        }
    }
}

/// HAMi's NVIDIA `Fit` for one container on one device, in its order of checks.
pub fn fit(capacity: Capacity, used: Use, request: &Request) -> Result<(), Refusal> {
    if i64::from(capacity.count) <= i64::from(used.containers) {
        return Err(Refusal::SplitCountUsedUp);
    }
    let cores = request.cores.min(100);
    if capacity.mem_mib - used.mem_mib < request.mem_on(capacity.mem_mib) {
        return Err(Refusal::Memory);
    }
    if capacity.cores - used.cores < cores {
        return Err(Refusal::Cores);
    }
    if capacity.cores == 100 && cores == 100 && used.containers > 0 {
        return Err(Refusal::ExclusiveOnUsedCard);
    }
    if capacity.cores != 0 && used.cores == capacity.cores && cores == 0 {
        return Err(Refusal::CoresExhausted);
    }
    Ok(())
}

/// Whether every one of `requests` fits the device on its own (each container of the pod
/// must be able to take a GPU coloc names).
pub fn fits_all(capacity: Capacity, used: Use, requests: &[Request]) -> Result<(), Refusal> {
    requests
        .iter()
        .try_for_each(|request| fit(capacity, used, request))
}

fn integer(quantity: &Quantity) -> Option<i64> {
    let raw = quantity.0.trim();
    raw.parse::<i64>()
        .ok()
        .or_else(|| raw.parse::<f64>().ok().map(|f| f as i64))
}

/// The GPU-requesting containers' asks (one per GPU each asks for); empty when the pod
/// asks HAMi for no GPU.
pub fn requests(pod: &Pod) -> Vec<Request> {
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    let mut asks = Vec::new();
    for container in &spec.containers {
        let resources = container.resources.as_ref();
        let value = |name: &str| {
            resources
                .and_then(|r| r.limits.as_ref().and_then(|l| l.get(name)))
                .or_else(|| resources.and_then(|r| r.requests.as_ref().and_then(|l| l.get(name))))
                .and_then(integer)
        };
        let Some(gpus) = value(GPU_RESOURCE).filter(|n| *n > 0) else {
            continue;
        };
        let mem = value(GPU_MEMORY_RESOURCE);
        let mem_mib = mem.unwrap_or(0).max(0);
        let percent = value(GPU_MEMORY_PERCENTAGE_RESOURCE);
        let cores = value(GPU_CORES_RESOURCE);
        // HAMi's admission: no cores, and 100 % or no memory size, is the whole card.
        let exclusive = cores.is_none()
            && match percent {
                Some(percent) => percent == 100,
                None => mem.is_none(),
            };
        let request = Request {
            mem_mib,
            mem_percent: percent.unwrap_or(100),
            cores: if exclusive { 100 } else { cores.unwrap_or(0) }.clamp(0, 100),
        };
        asks.extend(std::iter::repeat_n(request, gpus as usize));
    }
    asks
}

/// The devices a pod's `hami.io/vgpu-devices-allocated` lists, each with its use.
pub fn allocations(annotation: &str) -> Vec<HamiAllocation> {
    annotation
        .split(';')
        .flat_map(|container| container.split(':'))
        .filter_map(|device| {
            let mut fields = device.split(',').map(str::trim);
            let id = fields.next().filter(|id| !id.is_empty())?;
            let _kind = fields.next();
            let mem_mib = fields.next().and_then(|m| m.parse().ok()).unwrap_or(0);
            let cores = fields.next().and_then(|c| c.parse().ok()).unwrap_or(0);
            Some(HamiAllocation {
                gpu: id.to_string(),
                mem_mib,
                cores,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const CARD: Capacity = Capacity {
        count: 10,
        mem_mib: 16_384,
        cores: 100,
    };

    fn ask(mem_mib: i64, cores: i64) -> Request {
        Request {
            mem_mib,
            mem_percent: 100,
            cores,
        }
    }

    #[test]
    fn fit_follows_hamis_checks_in_order() {
        let used = |containers, mem_mib, cores| Use {
            containers,
            mem_mib,
            cores,
        };
        assert_eq!(fit(CARD, used(0, 0, 0), &ask(4096, 30)), Ok(()));
        assert_eq!(
            fit(CARD, used(10, 0, 0), &ask(1, 0)),
            Err(Refusal::SplitCountUsedUp)
        );
        assert_eq!(
            fit(CARD, used(2, 14_000, 10), &ask(4096, 10)),
            Err(Refusal::Memory)
        );
        // Exactly the free memory and cores fit.
        assert_eq!(fit(CARD, used(2, 12_288, 70), &ask(4096, 30)), Ok(()));
        assert_eq!(
            fit(CARD, used(2, 0, 71), &ask(1024, 30)),
            Err(Refusal::Cores)
        );
        assert_eq!(
            fit(CARD, used(1, 0, 0), &ask(1024, 100)),
            Err(Refusal::ExclusiveOnUsedCard)
        );
        assert_eq!(
            fit(CARD, used(1, 1024, 100), &ask(1024, 0)),
            Err(Refusal::CoresExhausted)
        );
        // A percentage takes that share of the card's memory.
        let half = Request {
            mem_mib: 0,
            mem_percent: 50,
            cores: 0,
        };
        assert_eq!(fit(CARD, used(1, 8_193, 0), &half), Err(Refusal::Memory));
        assert_eq!(fit(CARD, used(1, 8_192, 0), &half), Ok(()));
    }

    #[test]
    fn requests_read_limits_then_requests_and_default_to_the_whole_card() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "spec": {"containers": [
                {"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1",
                    "nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "30"}}},
                {"name": "b", "resources": {"requests": {"nvidia.com/gpu": "2"}}},
                {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1",
                    "nvidia.com/gpumem-percentage": "25"}}},
                {"name": "d", "resources": {"limits": {"cpu": "1"}}}
            ]}
        }))
        .unwrap();
        assert_eq!(
            requests(&pod),
            [
                ask(3000, 30),
                ask(0, 100),
                ask(0, 100),
                Request {
                    mem_mib: 0,
                    mem_percent: 25,
                    cores: 0
                }
            ]
        );
    }

    #[test]
    fn allocations_read_hamis_annotation() {
        let one = |gpu: &str, mem_mib, cores| HamiAllocation {
            gpu: gpu.into(),
            mem_mib,
            cores,
        };
        assert_eq!(
            allocations("GPU-a,NVIDIA,3000,30:;GPU-b,NVIDIA,1000,0:GPU-a,NVIDIA,500,5:;"),
            [
                one("GPU-a", 3000, 30),
                one("GPU-b", 1000, 0),
                one("GPU-a", 500, 5)
            ]
        );
    }
}
