//! The cluster as the extender sees it: the one cluster view of [`crate::cluster`] (its
//! header states the sources, their precedence and the API the extender and the admission
//! webhook read), under the name the extender has always used. The watcher and coloc's
//! agents feed it, AssignJob and ReleaseJob too; filter and prioritize read it.

pub use crate::cluster::{
    ClusterView, HamiAllocation, NodeGpus, Occupancy, PodDevices, Residency, Resident, ResidentRef,
    Source, ViewGpu, WatchedPod,
};
