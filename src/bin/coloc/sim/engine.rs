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
mod tests;
