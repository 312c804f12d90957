//! The event-driven cluster: G GPUs, a queue, and three kinds of events (a job arrives, a
//! job finishes, a job that ran out of memory is submitted again).
//!
//! Each running job runs at its speed for its GPU's current set (the truth: measured, or
//! the conservative bound after departures) and is re-rated whenever that set changes.
//! Placing a job where the set overflows memory is an out-of-memory event: the job fails at
//! once (the residents go on) and is submitted again `retry_delay` seconds later at the
//! tail of the queue.
//!
//! How the queue is offered to the policy after each instant's events ([`Queue`]):
//! - `k8s` (the default), as kube-scheduler does with its active and unschedulable queues:
//!   the waiting jobs are offered in the order they entered the queue; a job the policy does
//!   not place stays and the next is offered; after a placement every waiting job is
//!   offered again from the head (the cluster changed).
//! - `fifo`: strict FIFO, the head first; when the head waits, everyone behind it waits.
//!
//! Under `k8s`, while the cluster does not change (no placement, no departure; arrivals and
//! out-of-memory failures change no GPU), a job whose workload and [`DecisionKey`] equal
//! those of a job already refused is refused without asking the policy: the policy would be
//! given the same inputs and answer the same. `Cluster::skip_known_refusals` turns this off
//! (tests compare both).

use std::{
    cmp::Reverse,
    collections::{BinaryHeap, HashMap, VecDeque},
};

use super::{
    policy::{DecisionKey, GpuView, JobView, Policy, Resident},
    trace::Job,
    truth::{Admission, SetKey, Truth},
};

#[derive(Debug, Clone)]
pub struct Cluster {
    pub gpus: usize,
    pub retry_delay: f64,
    pub queue: Queue,
    /// Under `k8s`, refuse a job without asking the policy when a job of the same inputs
    /// was refused since the cluster last changed (module header). Exact; off only to test
    /// that it is.
    pub skip_known_refusals: bool,
}

impl Cluster {
    pub fn new(gpus: usize, retry_delay: f64, queue: Queue) -> Self {
        Self {
            gpus,
            retry_delay,
            queue,
            skip_known_refusals: true,
        }
    }
}

/// How waiting jobs are offered to the policy (module header).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Queue {
    K8s,
    Fifo,
}

impl Queue {
    pub const ALL: [Queue; 2] = [Queue::K8s, Queue::Fifo];

    pub fn name(self) -> &'static str {
        match self {
            Queue::K8s => "k8s",
            Queue::Fifo => "fifo",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|q| q.name() == name)
    }
}

/// What became of a job offered to the policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Offer {
    /// Placed on a GPU: the cluster changed.
    Placed,
    /// Placed where the set overflows memory: failed at once, submitted again later; no GPU
    /// changed.
    OutOfMemory,
    /// The policy kept it waiting.
    Refused,
}

/// What happened to one job.
#[derive(Debug, Clone, PartialEq)]
pub struct JobOutcome {
    pub arrival: f64,
    /// Start of the run that finished.
    pub start: f64,
    pub finish: f64,
    /// Lowest speed it ran at for some time, as a share of its exclusive speed (a speed
    /// held for no time, between events of one instant, is not counted).
    pub min_speed: f64,
    /// Seconds it ran below its cap.
    pub seconds_below_cap: f64,
    pub cap: Option<f64>,
}

impl JobOutcome {
    pub fn completion_time(&self) -> f64 {
        self.finish - self.arrival
    }

    pub fn queueing_delay(&self) -> f64 {
        self.start - self.arrival
    }
}

/// One simulation's result.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub jobs: Vec<JobOutcome>,
    pub makespan: f64,
    /// ∫ GPUs with at least one job dt.
    pub busy_gpu_seconds: f64,
    /// ∫ running jobs dt.
    pub job_seconds: f64,
    /// Job-seconds run at the conservative bound (a set never measured).
    pub bound_job_seconds: f64,
    pub oom_events: u64,
    /// (time, busy GPUs) at every change.
    pub busy_series: Vec<(f64, u32)>,
    /// Most jobs on one GPU at once.
    pub max_set: usize,
    /// ∫ running jobs dt by the size of the set each runs in (index = jobs on its GPU,
    /// 0 unused; sets larger than four count as four).
    pub job_seconds_by_set_size: [f64; 5],
    /// The same for capped (LS) jobs only.
    pub capped_job_seconds_by_set_size: [f64; 5],
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum EventKind {
    // Completions first at equal times, so that a freed GPU is seen by the arrivals.
    Finish {
        job: usize,
        version: u32,
    },
    Arrive {
        job: usize,
    },
    /// A GPU's set has run unchanged for [`REPORT_AFTER_S`] since its `version`: a policy
    /// that learns is told its measured speeds.
    Report {
        gpu: usize,
        version: u64,
    },
}

/// How long a set of two or more jobs runs unchanged before the scheduler reports its
/// measured throughputs to a policy that learns (what a node agent's measurement window
/// would take); fixed before any learning policy was run.
pub const REPORT_AFTER_S: f64 = 600.0;

#[derive(Debug, Clone, Copy, PartialEq)]
struct Event {
    time: f64,
    seq: u64,
    kind: EventKind,
}

impl Eq for Event {}

impl PartialOrd for Event {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Event {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.time
            .total_cmp(&other.time)
            .then(self.kind.cmp(&other.kind))
            .then(self.seq.cmp(&other.seq))
    }
}

#[derive(Debug, Clone, Default)]
struct Running {
    gpu: usize,
    remaining: f64,
    speed: f64,
    on_bound: bool,
    since: f64,
    version: u32,
}

#[derive(Debug, Default, Clone)]
struct Gpu {
    jobs: Vec<usize>,
    residents: Vec<Resident>,
    set: SetKey,
    milli: u32,
    memory_gb: f64,
    /// Bumped by every change of the set.
    version: u64,
}

impl Default for SetKey {
    fn default() -> Self {
        SetKey::EMPTY
    }
}

struct State<'a> {
    jobs: &'a [Job],
    truth: &'a Truth,
    gpus: Vec<Gpu>,
    running: Vec<Option<Running>>,
    outcomes: Vec<Option<JobOutcome>>,
    min_speed: Vec<f64>,
    below_cap: Vec<f64>,
    starts: Vec<f64>,
    events: BinaryHeap<Reverse<Event>>,
    seq: u64,
    now: f64,
    busy_gpus: u32,
    running_jobs: u32,
    out: Outcome,
    retry: f64,
    /// Bumped by every placement and departure, and whenever a learning policy says its
    /// answers may have changed.
    cluster_version: u64,
    /// The policy learns from reported sets (`Policy::learns`).
    learning: bool,
}

/// The waiting jobs, in the order they entered the queue.
enum Waiting {
    /// One line (`fifo`, and `k8s` without the shortcut).
    InOrder(VecDeque<usize>),
    /// `k8s` with the shortcut: one line per (workload, decision key), each in queue order,
    /// so that the jobs of a key refused since the last change are passed over at once.
    Keyed(KeyedQueue),
}

struct KeyedQueue {
    /// Index into `lines` of each job's (workload, decision key).
    key_of: Vec<usize>,
    /// (position in the queue, job), by key.
    lines: Vec<VecDeque<(u64, usize)>>,
    /// The cluster version at which each key was last refused.
    refused_at: Vec<Option<u64>>,
    next_position: u64,
    len: usize,
}

impl KeyedQueue {
    fn new(keys: &[(u8, DecisionKey)]) -> Self {
        let mut index: HashMap<(u8, DecisionKey), usize> = HashMap::new();
        let key_of: Vec<usize> = keys
            .iter()
            .map(|k| {
                let next = index.len();
                *index.entry(*k).or_insert(next)
            })
            .collect();
        Self {
            key_of,
            lines: vec![VecDeque::new(); index.len()],
            refused_at: vec![None; index.len()],
            next_position: 0,
            len: 0,
        }
    }

    fn push(&mut self, job: usize) {
        self.lines[self.key_of[job]].push_back((self.next_position, job));
        self.next_position += 1;
        self.len += 1;
    }

    /// The key of the earliest waiting job whose key was not refused at `version`.
    fn first_not_refused(&self, version: u64) -> Option<usize> {
        (0..self.lines.len())
            .filter(|&k| self.refused_at[k] != Some(version))
            .filter_map(|k| self.lines[k].front().map(|&(position, _)| (position, k)))
            .min()
            .map(|(_, k)| k)
    }
}

impl Waiting {
    fn push(&mut self, job: usize) {
        match self {
            Waiting::InOrder(line) => line.push_back(job),
            Waiting::Keyed(keyed) => keyed.push(job),
        }
    }

    fn is_empty(&self) -> bool {
        match self {
            Waiting::InOrder(line) => line.is_empty(),
            Waiting::Keyed(keyed) => keyed.len == 0,
        }
    }
}

impl State<'_> {
    fn push(&mut self, time: f64, kind: EventKind) {
        self.seq += 1;
        self.events.push(Reverse(Event {
            time,
            seq: self.seq,
            kind,
        }));
    }

    fn advance(&mut self, time: f64) {
        let dt = time - self.now;
        if dt > 0.0 {
            self.out.busy_gpu_seconds += f64::from(self.busy_gpus) * dt;
            self.out.job_seconds += f64::from(self.running_jobs) * dt;
            for g in &self.gpus {
                let size = g.jobs.len().min(4);
                if size > 0 {
                    let capped = g
                        .jobs
                        .iter()
                        .filter(|&&j| self.jobs[j].cap.is_some())
                        .count();
                    self.out.job_seconds_by_set_size[size] += size as f64 * dt;
                    self.out.capped_job_seconds_by_set_size[size] += capped as f64 * dt;
                }
            }
        }
        self.now = time;
    }

    /// Brings every job on `gpu` up to now at its old speed, then gives each the speed of
    /// the GPU's current set and a new finish event.
    fn rerate(&mut self, gpu: usize) {
        let now = self.now;
        let set = self.gpus[gpu].set;
        self.gpus[gpu].version += 1;
        let speeds = if self.gpus[gpu].jobs.is_empty() {
            None
        } else {
            Some(self.truth.speeds(set).unwrap_or_else(|| {
                panic!("the set {set:?} has neither a measurement nor a measured superset")
            }))
        };
        if self.learning
            && self.gpus[gpu].jobs.len() >= 2
            && speeds.as_ref().is_some_and(|s| !s.bound)
        {
            let version = self.gpus[gpu].version;
            self.push(now + REPORT_AFTER_S, EventKind::Report { gpu, version });
        }
        for &j in &self.gpus[gpu].jobs.clone() {
            let speeds = speeds.as_ref().expect("a GPU with jobs has speeds");
            let r = self.running[j].as_mut().expect("a job on a GPU runs");
            let elapsed = now - r.since;
            r.remaining = (r.remaining - elapsed * r.speed).max(0.0);
            if r.on_bound {
                self.out.bound_job_seconds += elapsed;
            }
            if let Some(cap) = self.jobs[j].cap {
                if r.speed < cap - 1e-12 {
                    self.below_cap[j] += elapsed;
                }
            }
            if elapsed > 0.0 {
                self.min_speed[j] = self.min_speed[j].min(r.speed);
            }
            r.since = now;
            r.speed = speeds.of(self.jobs[j].workload);
            r.on_bound = speeds.bound;
            r.version += 1;
            let (finish, version) = (now + r.remaining / r.speed, r.version);
            self.push(finish, EventKind::Finish { job: j, version });
        }
    }

    fn set_busy(&mut self) {
        let busy = self.gpus.iter().filter(|g| !g.jobs.is_empty()).count() as u32;
        if busy != self.busy_gpus {
            self.busy_gpus = busy;
            self.out.busy_series.push((self.now, busy));
        }
    }

    fn place(&mut self, j: usize, gpu: usize) {
        let job = &self.jobs[j];
        let g = &mut self.gpus[gpu];
        g.jobs.push(j);
        g.residents.push(view(job));
        g.set = g.set.with(job.workload);
        g.milli += job.gpu_milli;
        g.memory_gb += self.truth.workloads[job.workload as usize].memory_gb;
        self.out.max_set = self.out.max_set.max(g.jobs.len());
        self.starts[j] = self.now;
        self.running[j] = Some(Running {
            gpu,
            remaining: job.work,
            speed: 1.0,
            on_bound: false,
            since: self.now,
            version: 0,
        });
        self.running_jobs += 1;
        self.rerate(gpu);
        self.set_busy();
    }

    fn finish(&mut self, j: usize) {
        let r = self.running[j].take().expect("a finishing job runs");
        if r.on_bound {
            self.out.bound_job_seconds += self.now - r.since;
        }
        if let Some(cap) = self.jobs[j].cap {
            if r.speed < cap - 1e-12 {
                self.below_cap[j] += self.now - r.since;
            }
        }
        if self.now > r.since {
            self.min_speed[j] = self.min_speed[j].min(r.speed);
        }
        let job = &self.jobs[j];
        let g = &mut self.gpus[r.gpu];
        let at = g.jobs.iter().position(|&x| x == j).expect("on its GPU");
        g.jobs.swap_remove(at);
        g.residents.swap_remove(at);
        let mut members = g.set.members();
        let m = members
            .iter()
            .position(|&w| w == job.workload)
            .expect("in its set");
        members.swap_remove(m);
        g.set = SetKey::of(&members);
        g.milli -= job.gpu_milli;
        g.memory_gb -= self.truth.workloads[job.workload as usize].memory_gb;
        if g.jobs.is_empty() {
            g.memory_gb = 0.0;
        }
        self.running_jobs -= 1;
        self.cluster_version += 1;
        self.outcomes[j] = Some(JobOutcome {
            arrival: job.arrival,
            start: self.starts[j],
            finish: self.now,
            min_speed: self.min_speed[j],
            seconds_below_cap: self.below_cap[j],
            cap: job.cap,
        });
        self.out.makespan = self.out.makespan.max(self.now);
        self.rerate(r.gpu);
        self.set_busy();
    }

    /// Offers job `j` to the policy and carries out its answer.
    fn offer(&mut self, j: usize, policy: &mut dyn Policy) -> Offer {
        let job = view(&self.jobs[j]);
        let (indices, admissions): (Vec<usize>, Vec<Admission>) = (0..self.gpus.len())
            .filter_map(|i| {
                let admission = self.truth.admission(self.gpus[i].set.with(job.workload));
                (admission != Admission::Unmeasured).then_some((i, admission))
            })
            .unzip();
        let choice = {
            let views: Vec<GpuView> = indices
                .iter()
                .zip(&admissions)
                .map(|(&i, a)| {
                    let g = &self.gpus[i];
                    GpuView {
                        residents: &g.residents,
                        set: g.set,
                        gpu_milli_used: g.milli,
                        memory_gb_used: g.memory_gb,
                        fits_memory: *a == Admission::Measured,
                    }
                })
                .collect();
            policy.choose(&job, &views)
        };
        let Some(pick) = choice else {
            return Offer::Refused;
        };
        if admissions[pick] == Admission::OverMemory {
            self.out.oom_events += 1;
            self.push(self.now + self.retry_delay(), EventKind::Arrive { job: j });
            Offer::OutOfMemory
        } else {
            self.place(j, indices[pick]);
            self.cluster_version += 1;
            Offer::Placed
        }
    }

    /// Strict FIFO: offers queued jobs head first until the head waits.
    fn dispatch_fifo(&mut self, queue: &mut VecDeque<usize>, policy: &mut dyn Policy) {
        while let Some(&j) = queue.front() {
            if self.offer(j, policy) == Offer::Refused {
                return;
            }
            queue.pop_front();
        }
    }

    /// kube-scheduler's order: every waiting job in queue order, a refused one stays; after
    /// a placement, from the head again.
    fn dispatch_k8s(&mut self, queue: &mut VecDeque<usize>, policy: &mut dyn Policy) {
        let mut at = 0;
        while at < queue.len() {
            match self.offer(queue[at], policy) {
                Offer::Refused => at += 1,
                Offer::OutOfMemory => {
                    queue.remove(at);
                }
                Offer::Placed => {
                    queue.remove(at);
                    at = 0;
                }
            }
        }
    }

    /// The same offers as [`State::dispatch_k8s`] but for those of jobs whose key was
    /// refused since the cluster last changed: walking the queue and passing over such
    /// jobs offers next the earliest job of a key not refused, which is what this takes.
    fn dispatch_k8s_keyed(&mut self, queue: &mut KeyedQueue, policy: &mut dyn Policy) {
        while let Some(k) = queue.first_not_refused(self.cluster_version) {
            let (position, j) = queue.lines[k].pop_front().expect("a waiting job");
            match self.offer(j, policy) {
                Offer::Refused => {
                    queue.lines[k].push_front((position, j));
                    queue.refused_at[k] = Some(self.cluster_version);
                }
                Offer::OutOfMemory | Offer::Placed => queue.len -= 1,
            }
        }
    }

    fn retry_delay(&self) -> f64 {
        self.retry
    }
}

fn view(job: &Job) -> JobView {
    JobView {
        workload: job.workload,
        gpu_milli: job.gpu_milli,
        cap: job.cap,
    }
}

/// Runs `jobs` (any order) on `cluster` under `policy`.
pub fn simulate(
    jobs: &[Job],
    truth: &Truth,
    cluster: &Cluster,
    policy: &mut dyn Policy,
) -> Outcome {
    let n = jobs.len();
    let mut state = State {
        jobs,
        truth,
        gpus: vec![Gpu::default(); cluster.gpus],
        running: vec![None; n],
        outcomes: vec![None; n],
        min_speed: vec![f64::INFINITY; n],
        below_cap: vec![0.0; n],
        starts: vec![0.0; n],
        events: BinaryHeap::with_capacity(4 * n),
        seq: 0,
        now: 0.0,
        busy_gpus: 0,
        running_jobs: 0,
        out: Outcome {
            jobs: Vec::new(),
            makespan: 0.0,
            busy_gpu_seconds: 0.0,
            job_seconds: 0.0,
            bound_job_seconds: 0.0,
            oom_events: 0,
            busy_series: vec![(0.0, 0)],
            max_set: 0,
            job_seconds_by_set_size: [0.0; 5],
            capped_job_seconds_by_set_size: [0.0; 5],
        },
        retry: cluster.retry_delay,
        cluster_version: 0,
        learning: policy.learns(),
    };
    // Arrivals in trace order (then by index) so that the queue is FIFO by submission.
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| jobs[a].arrival.total_cmp(&jobs[b].arrival).then(a.cmp(&b)));
    for j in order {
        state.push(jobs[j].arrival, EventKind::Arrive { job: j });
    }
    if let Some(first) = jobs.iter().map(|j| j.arrival).min_by(f64::total_cmp) {
        state.now = first;
        state.out.busy_series[0].0 = first;
    }
    let mut queue = if cluster.queue == Queue::K8s && cluster.skip_known_refusals {
        let keys: Vec<(u8, DecisionKey)> = jobs
            .iter()
            .map(|job| (job.workload, policy.decision_key(&view(job))))
            .collect();
        Waiting::Keyed(KeyedQueue::new(&keys))
    } else {
        Waiting::InOrder(VecDeque::new())
    };
    while let Some(Reverse(event)) = state.events.pop() {
        state.advance(event.time);
        match event.kind {
            EventKind::Arrive { job } => queue.push(job),
            EventKind::Finish { job, version } => {
                if state.running[job]
                    .as_ref()
                    .is_some_and(|r| r.version == version)
                {
                    state.finish(job);
                }
            }
            EventKind::Report { gpu, version } => {
                if state.gpus[gpu].version == version {
                    let members: Vec<(u8, f64)> = state.gpus[gpu]
                        .jobs
                        .iter()
                        .map(|&j| {
                            let r = state.running[j].as_ref().expect("a job on a GPU runs");
                            (state.jobs[j].workload, r.speed)
                        })
                        .collect();
                    if policy.observe(&members, state.now) {
                        // The policy may now answer otherwise: offer refused jobs again.
                        state.cluster_version += 1;
                    }
                }
            }
        }
        // Every event at this instant first, then one dispatch.
        if state
            .events
            .peek()
            .is_some_and(|Reverse(next)| next.time == state.now)
        {
            continue;
        }
        match (&mut queue, cluster.queue) {
            (Waiting::Keyed(keyed), _) => state.dispatch_k8s_keyed(keyed, policy),
            (Waiting::InOrder(line), Queue::K8s) => state.dispatch_k8s(line, policy),
            (Waiting::InOrder(line), Queue::Fifo) => state.dispatch_fifo(line, policy),
        }
    }
    assert!(queue.is_empty(), "jobs left waiting with every GPU free");
    let first = jobs.iter().map(|j| j.arrival).fold(f64::INFINITY, f64::min);
    state.out.makespan -= if first.is_finite() { first } else { 0.0 };
    state.out.jobs = state
        .outcomes
        .into_iter()
        .map(|o| o.expect("every job finishes"))
        .collect();
    state.out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::{
        policy::{FractionPack, OnePerGpu, Oracle, PlaceRule},
        truth::Workload,
    };

    fn workload(name: &str, memory_gb: f64) -> Workload {
        Workload {
            name: name.into(),
            exclusive_throughput: 10.0,
            memory_gb,
            inference: true,
            batch_size: 2,
        }
    }

    fn job(name: &str, arrival: f64, work: f64, workload: u8) -> Job {
        Job {
            name: name.into(),
            arrival,
            work,
            workload,
            gpu_milli: 500,
            cap: None,
        }
    }

    /// One GPU, the default queue (the tests below have at most one job waiting behind a
    /// refused one, so both queues give their results).
    fn one_gpu() -> Cluster {
        Cluster::new(1, 60.0, Queue::K8s)
    }

    fn finishes(outcome: &Outcome) -> Vec<f64> {
        outcome.jobs.iter().map(|j| j.finish).collect()
    }

    #[test]
    fn two_jobs_that_keep_full_speed_together_finish_in_half_the_makespan() {
        // Together each keeps its exclusive throughput (10): the pair doubles the GPU's work.
        let truth =
            Truth::new(vec![workload("a", 1.0)], &[(vec![0, 0], vec![10.0, 10.0])]).unwrap();
        let jobs = [job("first", 0.0, 100.0, 0), job("second", 0.0, 100.0, 0)];
        let alone = simulate(&jobs, &truth, &one_gpu(), &mut OnePerGpu);
        assert_eq!(finishes(&alone), vec![100.0, 200.0]);
        assert_eq!(alone.makespan, 200.0);
        assert_eq!(alone.jobs[1].queueing_delay(), 100.0);
        assert_eq!(alone.busy_gpu_seconds, 200.0);
        let shared = simulate(
            &jobs,
            &truth,
            &one_gpu(),
            &mut Oracle::new(&truth, PlaceRule::Gain),
        );
        assert_eq!(finishes(&shared), vec![100.0, 100.0]);
        assert_eq!(shared.makespan, 100.0);
        assert_eq!(shared.busy_gpu_seconds, 100.0);
        assert_eq!(shared.job_seconds, 200.0);
    }

    #[test]
    fn a_job_is_re_rated_when_its_partner_leaves() {
        // Together both run at half speed: the short job (50 s of work) ends at 100 s,
        // having let the long one do 50 of its 100 s; the rest runs alone, ending at 150 s.
        let truth = Truth::new(
            vec![workload("a", 1.0), workload("b", 1.0)],
            &[(vec![0, 1], vec![5.0, 5.0])],
        )
        .unwrap();
        let jobs = [job("long", 0.0, 100.0, 0), job("short", 0.0, 50.0, 1)];
        let outcome = simulate(&jobs, &truth, &one_gpu(), &mut FractionPack);
        assert_eq!(finishes(&outcome), vec![150.0, 100.0]);
        assert_eq!(outcome.jobs[0].min_speed, 0.5);
        assert_eq!(outcome.bound_job_seconds, 0.0);
    }

    /// a+a and a+a+b measured (in the latter a at 0.2, b at 0.4 of their 10), a+b not.
    fn pair_and_triple_but_not_a_b() -> Truth {
        Truth::new(
            vec![workload("a", 1.0), workload("b", 1.0)],
            &[
                (vec![0, 0], vec![5.0, 5.0]),
                (vec![0, 0, 1], vec![2.0, 2.0, 4.0]),
            ],
        )
        .unwrap()
    }

    /// Jobs a1, a2 (workload a) and b, each (arrival, work), at 300 thousandths of a GPU so
    /// that fraction packing puts all three on one.
    fn three_jobs(timing: [(f64, f64); 3]) -> [Job; 3] {
        let [a1, a2, b] = timing;
        let mut jobs = [
            job("a1", a1.0, a1.1, 0),
            job("a2", a2.0, a2.1, 0),
            job("b", b.0, b.1, 1),
        ];
        for j in &mut jobs {
            j.gpu_milli = 300;
        }
        jobs
    }

    /// Fraction packing that records what it is told.
    struct Listening {
        told: Vec<(f64, Vec<(u8, f64)>)>,
    }

    impl Policy for Listening {
        fn name(&self) -> &str {
            "listening"
        }
        fn choose(&mut self, job: &JobView, gpus: &[GpuView]) -> Option<usize> {
            FractionPack.choose(job, gpus)
        }
        fn learns(&self) -> bool {
            true
        }
        fn observe(&mut self, members: &[(u8, f64)], now: f64) -> bool {
            let mut members = members.to_vec();
            members.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
            self.told.push((now, members));
            false
        }
    }

    #[test]
    fn a_learning_policy_is_told_each_measured_set_that_ran_long_enough_and_nothing_else() {
        // a+a runs from 0 s; b joins at 300 s, before a+a has run the 600 s a report needs.
        // a+a+b (a at 0.2, b at 0.4) then runs until a1 finishes at 300 + (1000 - 150) /
        // 0.2 = 4 550 s: told once, at 900 s. a+b was never measured: it runs at the bound
        // and is not told; a job alone is no colocation.
        let truth = pair_and_triple_but_not_a_b();
        let jobs = three_jobs([(0.0, 1000.0), (0.0, 20_000.0), (300.0, 2000.0)]);
        let mut listening = Listening { told: Vec::new() };
        let outcome = simulate(&jobs, &truth, &one_gpu(), &mut listening);
        assert!(
            (outcome.jobs[0].finish - 4550.0).abs() < 1e-6,
            "{outcome:?}"
        );
        assert!(outcome.bound_job_seconds > 0.0);
        assert_eq!(
            listening.told,
            vec![(900.0, vec![(0, 0.2), (0, 0.2), (1, 0.4)])]
        );
        // A policy that does not learn runs the same simulation.
        assert_eq!(
            simulate(&jobs, &truth, &one_gpu(), &mut FractionPack),
            outcome
        );
    }

    #[test]
    fn no_policy_may_create_a_set_that_was_never_measured() {
        // a+a was measured, a+b was not: fraction packing would put b beside a (500 + 500
        // thousandths fit), but the engine does not offer that GPU, so b waits.
        let truth = Truth::new(
            vec![workload("a", 1.0), workload("b", 1.0)],
            &[(vec![0, 0], vec![5.0, 5.0])],
        )
        .unwrap();
        let jobs = [job("a", 0.0, 100.0, 0), job("b", 10.0, 100.0, 1)];
        let outcome = simulate(&jobs, &truth, &one_gpu(), &mut FractionPack);
        assert_eq!(outcome.max_set, 1);
        assert_eq!(finishes(&outcome), vec![100.0, 200.0]);
    }

    #[test]
    fn departures_that_leave_an_unmeasured_set_run_at_the_bound_and_are_counted() {
        // a+a and a+a+b were measured (in the latter a at 0.2, b at 0.4), a+b was not. When the first a leaves at 50 s
        // (10 s of work at 0.2), a+b was never measured: the bound gives each its speed in
        // that superset. The second a then needs (30 - 10) / 0.2 = 100 s more, b (40 - 20)
        // / 0.4 = 50 s: b ends at 100 s, then a runs alone: 10 s of work left at 100 s,
        // ending at 110 s. Bound time: two jobs x 50 s.
        let truth = pair_and_triple_but_not_a_b();
        let jobs = three_jobs([(0.0, 10.0), (0.0, 30.0), (0.0, 40.0)]);
        let outcome = simulate(&jobs, &truth, &one_gpu(), &mut FractionPack);
        let f = finishes(&outcome);
        assert_eq!(f[0], 50.0);
        assert!((f[2] - 100.0).abs() < 1e-9, "{f:?}");
        assert!((f[1] - 110.0).abs() < 1e-9, "{f:?}");
        assert!((outcome.bound_job_seconds - 100.0).abs() < 1e-9);
        assert_eq!(outcome.max_set, 3);
        // Job-time by set size: three jobs together for 50 s, the pair a+b for 50 s, a alone
        // for 10 s; no job has a cap.
        let by_size = outcome.job_seconds_by_set_size;
        for (size, want) in [(1, 10.0), (2, 100.0), (3, 150.0), (4, 0.0)] {
            assert!((by_size[size] - want).abs() < 1e-9, "{by_size:?}");
        }
        assert_eq!(outcome.capped_job_seconds_by_set_size, [0.0; 5]);
    }

    #[test]
    fn the_pairs_oracle_never_creates_a_set_of_three() {
        // a+a at 0.8 each (Σ 1.6) and a+a+a at 0.6 each (Σ 1.8): the oracle puts all three
        // on the GPU at once and each does its 60 s of work at 0.6, ending at 100 s. The
        // pairs oracle starts a pair (60 / 0.8 = 75 s) and the third alone after it, ending
        // at 135 s.
        let truth = Truth::new(
            vec![workload("a", 1.0)],
            &[
                (vec![0, 0], vec![8.0, 8.0]),
                (vec![0, 0, 0], vec![6.0, 6.0, 6.0]),
            ],
        )
        .unwrap();
        let jobs = [
            job("a1", 0.0, 60.0, 0),
            job("a2", 0.0, 60.0, 0),
            job("a3", 0.0, 60.0, 0),
        ];
        let rule = PlaceRule::FairShare;
        let all = simulate(&jobs, &truth, &one_gpu(), &mut Oracle::new(&truth, rule));
        assert_eq!(all.max_set, 3);
        for f in finishes(&all) {
            assert!((f - 100.0).abs() < 1e-9, "{f}");
        }
        let pairs = simulate(&jobs, &truth, &one_gpu(), &mut Oracle::pairs(&truth, rule));
        assert_eq!(pairs.max_set, 2);
        let f = finishes(&pairs);
        assert_eq!(f[0], 75.0);
        assert_eq!(f[1], 75.0);
        assert!((f[2] - 135.0).abs() < 1e-9, "{f:?}");
    }

    #[test]
    fn a_set_over_gpu_memory_fails_the_job_and_resubmits_it() {
        // Two 20 GB jobs do not fit a 32 GB GPU: fraction packing tries at 0 s and again at
        // the retry (60 s, still full), then at 120 s the GPU is free.
        let truth = Truth::new(vec![workload("big", 20.0)], &[]).unwrap();
        let jobs = [job("first", 0.0, 100.0, 0), job("second", 0.0, 100.0, 0)];
        let outcome = simulate(&jobs, &truth, &one_gpu(), &mut FractionPack);
        assert_eq!(outcome.oom_events, 2);
        assert_eq!(finishes(&outcome), vec![100.0, 220.0]);
        assert_eq!(outcome.jobs[1].start, 120.0);
        // A policy that checks memory waits instead.
        let careful = simulate(
            &jobs,
            &truth,
            &one_gpu(),
            &mut Oracle::new(&truth, PlaceRule::Gain),
        );
        assert_eq!(careful.oom_events, 0);
        assert_eq!(finishes(&careful), vec![100.0, 200.0]);
    }

    #[test]
    fn a_short_job_that_would_shrink_the_sum_waits_under_gain_and_starts_under_break_even() {
        // Two long jobs of `a` together keep 0.6 each (Σ 1.2); a third member of `b` makes
        // them 0.4 and 0.3 (Σ 1.1 >= 1, gain -0.1; b at 0.3 < 1/3).
        let truth = Truth::new(
            vec![workload("a", 1.0), workload("b", 1.0)],
            &[
                (vec![0, 0], vec![6.0, 6.0]),
                (vec![0, 0, 1], vec![4.0, 4.0, 3.0]),
            ],
        )
        .unwrap();
        let jobs = [
            job("long-1", 0.0, 120.0, 0),
            job("long-2", 0.0, 120.0, 0),
            job("short", 0.0, 3.0, 1),
        ];
        let run = |rule| simulate(&jobs, &truth, &one_gpu(), &mut Oracle::new(&truth, rule));
        // Gain and fair share: the short job waits until the pair ends at 120 / 0.6 = 200 s.
        for rule in [PlaceRule::Gain, PlaceRule::FairShare] {
            let waits = run(rule);
            assert_eq!(waits.max_set, 2, "{rule:?}");
            let f = finishes(&waits);
            assert!(
                (f[0] - 200.0).abs() < 1e-9 && (f[2] - 203.0).abs() < 1e-9,
                "{f:?}"
            );
        }
        // Break-even: all three start at 0; the short job ends at 3 / 0.3 = 10 s, when each
        // long one has done 4 s of work; the other 116 s at 0.6 end at 10 + 193.3 s.
        let starts = run(PlaceRule::BreakEven);
        assert_eq!(starts.max_set, 3);
        let f = finishes(&starts);
        assert!((f[2] - 10.0).abs() < 1e-9, "{f:?}");
        assert!((f[0] - (10.0 + 116.0 / 0.6)).abs() < 1e-9, "{f:?}");
        assert!(starts.jobs.iter().all(|j| j.queueing_delay() == 0.0));
    }

    #[test]
    fn under_k8s_a_job_that_can_share_starts_past_a_head_that_fits_nowhere() {
        // Workloads a, h, s (1 GB each, exclusive throughput 10). Measured: a+h at 0.5 each,
        // a+s at 0.8 each; h+s never. A (a, 100 s of work) arrives at 0; H (h, LS with cap
        // 0.9, 50 s) at 10; S (s, 40 s) at 20. One GPU, the oracle under break-even.
        let truth = Truth::new(
            vec![workload("a", 1.0), workload("h", 1.0), workload("s", 1.0)],
            &[(vec![0, 1], vec![5.0, 5.0]), (vec![0, 2], vec![8.0, 8.0])],
        )
        .unwrap();
        let mut jobs = [
            job("A", 0.0, 100.0, 0),
            job("H", 10.0, 50.0, 1),
            job("S", 20.0, 40.0, 2),
        ];
        jobs[1].cap = Some(0.9);
        let run = |queue| {
            simulate(
                &jobs,
                &truth,
                &Cluster::new(1, 60.0, queue),
                &mut Oracle::new(&truth, PlaceRule::BreakEven),
            )
        };
        // fifo: H would run at 0.5 < 0.9 beside A and waits at the head; S waits behind it.
        // A ends alone at 100; H runs alone 100-150 (h+s was never measured, so S cannot
        // join); S runs alone 150-190.
        let fifo = run(Queue::Fifo);
        assert_eq!(finishes(&fifo), vec![100.0, 150.0, 190.0]);
        assert_eq!(fifo.makespan, 190.0);
        assert_eq!(fifo.max_set, 1);
        // k8s: H is refused and S, offered next, starts at 20 beside A (0.8 each). S's 40 s
        // of work end at 20 + 40 / 0.8 = 70; A has done 20 + 50 x 0.8 = 60 by then and
        // ends alone at 70 + 40 = 110; H, refused beside A and beside A+S, runs 110-160.
        let k8s = run(Queue::K8s);
        let f = finishes(&k8s);
        let expected = [110.0, 160.0, 70.0];
        assert!(
            f.iter().zip(expected).all(|(a, b)| (a - b).abs() < 1e-9),
            "{f:?}"
        );
        assert_eq!(k8s.jobs[2].start, 20.0);
        assert_eq!(k8s.jobs[1].start, 110.0);
        assert_eq!(k8s.max_set, 2);
        assert!((k8s.makespan - 160.0).abs() < 1e-9);
        // Without the shortcut, the same.
        let mut plain = Cluster::new(1, 60.0, Queue::K8s);
        plain.skip_known_refusals = false;
        let oracle = &mut Oracle::new(&truth, PlaceRule::BreakEven);
        assert_eq!(simulate(&jobs, &truth, &plain, oracle), k8s);
    }

    #[test]
    fn the_time_a_capped_job_runs_below_its_cap_is_counted() {
        let truth = Truth::new(
            vec![workload("a", 1.0), workload("b", 1.0)],
            &[(vec![0, 1], vec![3.0, 5.0])],
        )
        .unwrap();
        let mut jobs = [job("capped", 0.0, 30.0, 0), job("other", 0.0, 100.0, 1)];
        jobs[0].cap = Some(0.5);
        let outcome = simulate(&jobs, &truth, &one_gpu(), &mut FractionPack);
        // a at 0.3 for 100 s (its 30 s of work), below its cap all that time.
        assert_eq!(outcome.jobs[0].finish, 100.0);
        assert_eq!(outcome.jobs[0].seconds_below_cap, 100.0);
        assert_eq!(outcome.jobs[1].seconds_below_cap, 0.0);
        // The pair for 100 s, then b alone for its last 50 s of work: of 250 job-seconds,
        // 50 alone and 200 in a pair; the capped job's 100 s all in the pair.
        assert_eq!(
            outcome.job_seconds_by_set_size,
            [0.0, 50.0, 200.0, 0.0, 0.0]
        );
        assert_eq!(
            outcome.capped_job_seconds_by_set_size,
            [0.0, 0.0, 100.0, 0.0, 0.0]
        );
        let summary = super::super::report::RunSummary::of("fraction-pack", 1, &outcome);
        assert_eq!(summary.job_time_share_by_set_size, [0.2, 0.8, 0.0, 0.0]);
        assert_eq!(
            summary.capped_job_time_share_by_set_size,
            [0.0, 1.0, 0.0, 0.0]
        );
        // The oracle keeps caps: it does not pair them (gain 0.3 + 0.5 - 1 < 0).
        let oracle = simulate(
            &jobs,
            &truth,
            &one_gpu(),
            &mut Oracle::new(&truth, PlaceRule::Gain),
        );
        assert_eq!(oracle.max_set, 1);
    }

    #[test]
    fn a_speed_held_for_no_time_is_not_the_lowest_speed_a_job_ran_at() {
        // a+b: a at 0.4; a+b+c: a at 0.6. A (a, cap 0.5), B and C1 arrive at 0 and are
        // placed one after another in the same instant, so A is at 0.4 (with B) for no time
        // before C1 joins. C1 (5 s of work at 0.5) ends at 10 s, and C2, waiting since 1 s
        // (a fourth job exceeds 1000 thousandths), takes its place at once: a+b again for no
        // time. A runs at 0.6 throughout and never below its cap.
        let truth = Truth::new(
            vec![workload("a", 1.0), workload("b", 1.0), workload("c", 1.0)],
            &[
                (vec![0, 1], vec![4.0, 5.0]),
                (vec![0, 1, 2], vec![6.0, 5.0, 5.0]),
            ],
        )
        .unwrap();
        let mut jobs = [
            job("A", 0.0, 100.0, 0),
            job("B", 0.0, 100.0, 1),
            job("C1", 0.0, 5.0, 2),
            job("C2", 1.0, 100.0, 2),
        ];
        jobs[0].cap = Some(0.5);
        for j in &mut jobs {
            j.gpu_milli = 300;
        }
        let outcome = simulate(&jobs, &truth, &one_gpu(), &mut FractionPack);
        assert_eq!(outcome.jobs[2].finish, 10.0);
        assert_eq!(outcome.jobs[3].start, 10.0);
        assert!((outcome.jobs[0].finish - 100.0 / 0.6).abs() < 1e-9);
        assert_eq!(outcome.jobs[0].seconds_below_cap, 0.0);
        assert_eq!(outcome.jobs[0].min_speed, 0.6);
        assert_eq!(outcome.jobs[1].min_speed, 0.5);
    }
}
