//! A colocated run: two or more workloads sharing one GPU, each with its measured throughput.

use std::collections::HashSet;

use super::{profile::MAX_THROUGHPUT, GpuName, SharingMode, ValidationError, WorkloadName};

/// More processes than this on one GPU is not a colocation coloc can say anything about.
pub const MAX_MEMBERS: usize = 16;
const MAX_JOB_ID_CHARS: usize = 256;

#[derive(Debug, Clone, PartialEq)]
pub struct ColocatedMember {
    pub workload: WorkloadName,
    pub throughput: f64,
    pub job_id: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Observation {
    pub gpu: GpuName,
    pub members: Vec<ColocatedMember>,
    /// 0 when unknown (imported datasets).
    pub observed_at_ms: i64,
    /// The scheduler's id of the GPU it ran on (as in AssignJob); empty when not said. Not
    /// part of the run's identity (fingerprint).
    pub gpu_id: String,
    /// How the GPU was shared; MPS unless said. Not part of the run's identity either: the
    /// same members and values at the same time cannot come from two modes.
    pub sharing_mode: SharingMode,
}

impl Observation {
    pub fn new(
        gpu: GpuName,
        members: Vec<ColocatedMember>,
        observed_at_ms: i64,
    ) -> Result<Self, ValidationError> {
        if members.len() < 2 {
            return Err(ValidationError::new(
                "members",
                format!(
                    "a colocated run needs at least 2 members, got {}",
                    members.len()
                ),
            ));
        }
        if members.len() > MAX_MEMBERS {
            return Err(ValidationError::new(
                "members",
                format!(
                    "a colocated run has at most {MAX_MEMBERS} members, got {}",
                    members.len()
                ),
            ));
        }
        let mut job_ids = HashSet::new();
        for (i, member) in members.iter().enumerate() {
            if !member.throughput.is_finite()
                || member.throughput < 0.0
                || member.throughput > MAX_THROUGHPUT
            {
                return Err(ValidationError::new(
                    format!("members[{i}].throughput"),
                    format!(
                        "throughput of {} must be a finite number >= 0 and at most \
                         {MAX_THROUGHPUT:e}, got {}",
                        member.workload, member.throughput
                    ),
                ));
            }
            if member.job_id.chars().count() > MAX_JOB_ID_CHARS {
                return Err(ValidationError::new(
                    format!("members[{i}].job_id"),
                    format!(
                        "job_id of {} is longer than {MAX_JOB_ID_CHARS} characters",
                        member.workload
                    ),
                ));
            }
            if !member.job_id.is_empty() && !job_ids.insert(member.job_id.as_str()) {
                return Err(ValidationError::new(
                    format!("members[{i}].job_id"),
                    format!(
                        "job {:?} is listed twice; each member is one job",
                        member.job_id
                    ),
                ));
            }
        }
        if observed_at_ms < 0 {
            return Err(ValidationError::new(
                "observed_at",
                "observed_at must not be before 1970",
            ));
        }
        Ok(Self {
            gpu,
            members,
            observed_at_ms,
            gpu_id: String::new(),
            sharing_mode: SharingMode::Mps,
        })
    }

    /// The identity of the run: the same GPU, time, members and values give the same text
    /// whatever the member order, so a repeated report is recognised.
    pub fn fingerprint(&self) -> String {
        let mut members: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("{}={:e}#{}", m.workload, m.throughput, m.job_id))
            .collect();
        members.sort();
        format!("{}|{}|{}", self.gpu, self.observed_at_ms, members.join(","))
    }

    pub fn throughput_sum(&self) -> f64 {
        self.members.iter().map(|m| m.throughput).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(name: &str, throughput: f64, job_id: &str) -> ColocatedMember {
        ColocatedMember {
            workload: WorkloadName::parse("w", name).unwrap(),
            throughput,
            job_id: job_id.into(),
        }
    }

    fn gpu() -> GpuName {
        GpuName::parse("gpu", "Tesla V100-SXM2-32GB").unwrap()
    }

    #[test]
    fn two_copies_of_one_workload_are_a_valid_run() {
        Observation::new(gpu(), vec![member("a", 1.0, ""), member("a", 2.0, "")], 5).unwrap();
    }

    #[test]
    fn one_member_a_repeated_job_and_bad_throughputs_are_rejected() {
        assert!(Observation::new(gpu(), vec![member("a", 1.0, "")], 0).is_err());
        assert!(
            Observation::new(gpu(), vec![member("a", 1.0, "j"), member("b", 1.0, "j")], 0).is_err()
        );
        assert!(Observation::new(
            gpu(),
            vec![member("a", f64::NAN, ""), member("b", 1.0, "")],
            0
        )
        .is_err());
        assert!(
            Observation::new(gpu(), vec![member("a", -1.0, ""), member("b", 1.0, "")], 0).is_err()
        );
    }

    #[test]
    fn the_fingerprint_ignores_member_order_but_not_values() {
        let ab =
            Observation::new(gpu(), vec![member("a", 1.0, ""), member("b", 2.0, "")], 7).unwrap();
        let ba =
            Observation::new(gpu(), vec![member("b", 2.0, ""), member("a", 1.0, "")], 7).unwrap();
        let other =
            Observation::new(gpu(), vec![member("a", 1.5, ""), member("b", 2.0, "")], 7).unwrap();
        assert_eq!(ab.fingerprint(), ba.fingerprint());
        assert_ne!(ab.fingerprint(), other.fingerprint());
    }
}
