//! The ten per-workload metrics of the KACE method as one feature vector, and the set
//! features a model sees: the element-wise sum over the members of a colocated set.

use crate::domain::{KernelMetrics, Profile, SystemMetrics};

pub const NUM_FEATURES: usize = 10;

/// Feature names, in vector order; also the names GetModel reports coefficients under.
pub const FEATURE_NAMES: [&str; NUM_FEATURES] = [
    "threads",
    "compute_throughput_pct",
    "dram_throughput_pct",
    "memory_throughput_pct",
    "registers",
    "static_shared_memory_bytes",
    "exclusive_throughput",
    "sm_busy_pct",
    "mem_busy_pct",
    "memory_gb",
];

/// The first six features come from Nsight Compute, the other four from NVML.
pub const KERNEL_METRICS: usize = 6;
const EXCLUSIVE_THROUGHPUT: usize = 6;
const MEMORY_GB: usize = 9;

/// How much of the method a set's profiles hold, and so which model answers for it
/// ([`super::ModelParams::at_level`]): every member with its kernel metrics, or at least one
/// profiled by NVML alone (Nsight Compute unavailable or forbidden), in which case the whole
/// set is answered from NVML metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProfileLevel {
    Full,
    NvmlOnly,
}

impl ProfileLevel {
    /// The level of a set whose members are NVML-only where `nvml_only` says so: NVML-only
    /// as soon as one member is.
    pub fn of_set(nvml_only: impl IntoIterator<Item = bool>) -> Self {
        if nvml_only.into_iter().any(|n| n) {
            Self::NvmlOnly
        } else {
            Self::Full
        }
    }

    /// A member's features as the model of this level reads them.
    pub fn features(self, features: &Features) -> Features {
        match self {
            Self::Full => *features,
            Self::NvmlOnly => features.nvml_only(),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Full => "full",
            Self::NvmlOnly => "nvml-only",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Features(pub [f64; NUM_FEATURES]);

impl Features {
    pub fn of(profile: &Profile) -> Self {
        Self::from_metrics(&profile.kernel, &profile.system)
    }

    /// The feature vector of a workload's kernel and system metrics.
    pub fn from_metrics(k: &KernelMetrics, s: &SystemMetrics) -> Self {
        Self([
            k.threads,
            k.compute_throughput_pct,
            k.dram_throughput_pct,
            k.memory_throughput_pct,
            k.registers,
            k.static_shared_memory_bytes,
            s.exclusive_throughput,
            s.sm_busy_pct,
            s.mem_busy_pct,
            s.memory_gb,
        ])
    }

    /// Element-wise sum over the members of a set (KACE's pair features, for any size).
    pub fn sum<'a>(members: impl IntoIterator<Item = &'a Features>) -> Self {
        let mut total = [0.0; NUM_FEATURES];
        for member in members {
            for (t, v) in total.iter_mut().zip(member.0) {
                *t += v;
            }
        }
        Self(total)
    }

    /// The profile as NVML alone measures it: the six Nsight Compute kernel metrics
    /// withheld (zero, a column every model leaves out as constant), the four system
    /// metrics kept. What a cluster that forbids performance counters in containers
    /// (ERR_NVGPUCTRPERM) can profile.
    pub fn nvml_only(&self) -> Self {
        let mut f = *self;
        f.0[..KERNEL_METRICS].fill(0.0);
        f
    }

    /// Whether every kernel metric is zero (a profile from NVML alone).
    pub fn is_nvml_only(&self) -> bool {
        self.0[..KERNEL_METRICS].iter().all(|v| *v == 0.0)
    }

    pub fn exclusive_throughput(&self) -> f64 {
        self.0[EXCLUSIVE_THROUGHPUT]
    }

    pub fn memory_gb(&self) -> f64 {
        self.0[MEMORY_GB]
    }

    /// A stable 64-bit identity of the exact metrics (each metric's bits folded in
    /// through the SplitMix64 finalizer): no library version can change it, so a model may
    /// store it (the profiles its seen bands cover, [`super::intervals::SeenBands`]).
    pub fn fingerprint(&self) -> u64 {
        let mix = |mut x: u64| {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            x ^ (x >> 31)
        };
        self.0.iter().fold(0, |x, v| mix(x ^ v.to_bits()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::profile_tests::sample_profile;

    #[test]
    fn features_follow_the_documented_order() {
        let f = Features::of(&sample_profile());
        assert_eq!(f.0[0], 321_403.5);
        assert_eq!(f.0[5], 7_439.6);
        assert_eq!(f.exclusive_throughput(), 98.3);
        assert_eq!(f.memory_gb(), 1.4);
    }

    /// Computed apart from this code (Python, the same SplitMix64 constants).
    const PINNED_ZERO_FINGERPRINT: u64 = 0x03b4_7311_4c51_963a;

    #[test]
    fn a_fingerprint_is_stable_and_tells_profiles_apart() {
        let a = Features([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0]);
        let mut b = a;
        b.0[9] = 10.000_000_000_000_002;
        assert_ne!(a.fingerprint(), b.fingerprint());
        assert_eq!(a.fingerprint(), Features(a.0).fingerprint());
        // Pinned: models store fingerprints, so the function may never change.
        assert_eq!(
            Features([0.0; NUM_FEATURES]).fingerprint(),
            PINNED_ZERO_FINGERPRINT
        );
    }

    #[test]
    fn an_nvml_only_profile_keeps_the_system_metrics_alone() {
        let f = Features([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0]);
        assert!(!f.is_nvml_only());
        let nvml = f.nvml_only();
        assert_eq!(nvml.0, [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 7.0, 8.0, 9.0, 10.0]);
        assert!(nvml.is_nvml_only());
    }

    #[test]
    fn set_features_are_the_element_wise_sum() {
        let a = Features([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0]);
        let b = Features([10.0; NUM_FEATURES]);
        let sum = Features::sum([&a, &b, &a]);
        assert_eq!(
            sum.0,
            [12.0, 14.0, 16.0, 18.0, 20.0, 22.0, 24.0, 26.0, 28.0, 30.0]
        );
    }
}
