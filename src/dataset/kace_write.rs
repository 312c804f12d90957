//! Writing a KACE-format dataset: the flat layout that [`KaceDataset::read`] reads
//! (kernel_metrics.csv, system_metrics.csv, pairs.csv in one folder), with pairs.csv's full
//! published column set so that the KACE artifact's own scripts can read it too.
//!
//! Every number is written so that it reads back bit for bit (the csv crate writes the
//! shortest decimal that parses to the same f64). Each file is written under a temporary
//! name in the folder, synced, then renamed into place: a crash leaves at worst a hidden
//! `.*.tmp` file, never a half-written file under a real name. The files are renamed
//! system_metrics.csv, pairs.csv, then kernel_metrics.csv, because kernel_metrics.csv is
//! what marks a folder as this layout to the reader.

use std::{
    collections::HashMap,
    fs,
    io::Write,
    path::{Path, PathBuf},
};

use serde::Serialize;
use tempfile::NamedTempFile;

use super::kace::{KaceDataset, KaceWorkload, KernelRow, SystemRow};

/// The three files of the layout, in the order they are renamed into place.
pub const KACE_FILES: [&str; 3] = ["system_metrics.csv", "pairs.csv", "kernel_metrics.csv"];

/// Whether existing dataset files in the folder may be replaced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overwrite {
    Refuse,
    Replace,
}

#[derive(Debug, thiserror::Error)]
pub enum KaceWriteError {
    #[error("{} already exists; export refuses to overwrite it (--force replaces it)", .0.display())]
    Exists(PathBuf),
    #[error("{} exists and is not a folder", .0.display())]
    NotAFolder(PathBuf),
    #[error("cannot create the folder {}", .0.display())]
    CreateFolder(PathBuf, #[source] std::io::Error),
    #[error("pair {row} names workload {name:?}, which is not among the dataset's workloads")]
    UnknownWorkload { row: usize, name: String },
    #[error("cannot write {}", .0.display())]
    Io(PathBuf, #[source] std::io::Error),
    #[error("cannot write {}", .0.display())]
    Csv(PathBuf, #[source] csv::Error),
}

/// What was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KaceWritten {
    pub workloads: usize,
    pub pairs: usize,
}

/// A row of pairs.csv: both members' kernel metrics, their names and 1-based positions in
/// kernel_metrics.csv, their colocated and exclusive throughputs and system metrics; the
/// columns in the published file's order.
#[derive(Serialize)]
struct PairRow<'a> {
    #[serde(rename = "w1_Threads")]
    w1_threads: f64,
    #[serde(rename = "w1_Compute (SM) Throughput")]
    w1_compute: f64,
    #[serde(rename = "w1_DRAM Throughput")]
    w1_dram: f64,
    #[serde(rename = "w1_Memory Throughput")]
    w1_memory: f64,
    #[serde(rename = "w1_Registers")]
    w1_registers: f64,
    #[serde(rename = "w1_Static Shared Memory")]
    w1_static_shared_memory: f64,
    #[serde(rename = "w2_Threads")]
    w2_threads: f64,
    #[serde(rename = "w2_Compute (SM) Throughput")]
    w2_compute: f64,
    #[serde(rename = "w2_DRAM Throughput")]
    w2_dram: f64,
    #[serde(rename = "w2_Memory Throughput")]
    w2_memory: f64,
    #[serde(rename = "w2_Registers")]
    w2_registers: f64,
    #[serde(rename = "w2_Static Shared Memory")]
    w2_static_shared_memory: f64,
    workload1: &'a str,
    workload2: &'a str,
    idx1: usize,
    idx2: usize,
    w1throughput: f64,
    w2throughput: f64,
    w1exclusive_throughput: f64,
    w2exclusive_throughput: f64,
    #[serde(rename = "w1sm%")]
    w1_sm_busy: f64,
    #[serde(rename = "w2sm%")]
    w2_sm_busy: f64,
    #[serde(rename = "w1mem%")]
    w1_mem_busy: f64,
    #[serde(rename = "w2mem%")]
    w2_mem_busy: f64,
    w1memcap: f64,
    w2memcap: f64,
}

/// The header lines, written even when a file has no rows (serde writes a header only with
/// the first row); a test checks them against the rows' own field names.
const KERNEL_HEADER: &str = "Threads,Compute (SM) Throughput,DRAM Throughput,Memory Throughput,\
    Registers,Static Shared Memory,Type";
const SYSTEM_HEADER: &str = "Type,Exclusive100,sm%,mem%,memcap";
const PAIRS_HEADER: &str = "w1_Threads,w1_Compute (SM) Throughput,w1_DRAM Throughput,\
    w1_Memory Throughput,w1_Registers,w1_Static Shared Memory,w2_Threads,\
    w2_Compute (SM) Throughput,w2_DRAM Throughput,w2_Memory Throughput,w2_Registers,\
    w2_Static Shared Memory,workload1,workload2,idx1,idx2,w1throughput,w2throughput,\
    w1exclusive_throughput,w2exclusive_throughput,w1sm%,w2sm%,w1mem%,w2mem%,w1memcap,w2memcap";

fn kernel_row(w: &KaceWorkload) -> KernelRow {
    KernelRow {
        threads: w.kernel.threads,
        compute: w.kernel.compute_throughput_pct,
        dram: w.kernel.dram_throughput_pct,
        memory: w.kernel.memory_throughput_pct,
        registers: w.kernel.registers,
        static_shared_memory: w.kernel.static_shared_memory_bytes,
        name: w.name.to_string(),
    }
}

fn system_row(w: &KaceWorkload) -> SystemRow {
    SystemRow {
        name: w.name.to_string(),
        exclusive_throughput: w.system.exclusive_throughput,
        sm_busy: w.system.sm_busy_pct,
        mem_busy: w.system.mem_busy_pct,
        memcap: w.system.memory_gb,
    }
}

/// One file, written under a temporary name in the target folder and synced, not yet in
/// place.
struct Staged {
    file: NamedTempFile,
    path: PathBuf,
}

fn stage<T: Serialize>(
    dir: &Path,
    name: &str,
    header: &str,
    rows: impl IntoIterator<Item = T>,
) -> Result<Staged, KaceWriteError> {
    let path = dir.join(name);
    let io = |e| KaceWriteError::Io(path.clone(), e);
    // A dataset file like any other (0o666 less the umask), not a private temporary one.
    let file = tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .suffix(".tmp")
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o666))
        .tempfile_in(dir)
        .map_err(io)?;
    let mut writer = csv::WriterBuilder::new()
        .has_headers(false)
        .from_writer(std::io::BufWriter::new(file.as_file()));
    writer
        .write_record(header.split(','))
        .map_err(|e| KaceWriteError::Csv(path.clone(), e))?;
    for row in rows {
        writer
            .serialize(row)
            .map_err(|e| KaceWriteError::Csv(path.clone(), e))?;
    }
    let mut buffered = writer
        .into_inner()
        .map_err(|e| KaceWriteError::Io(path.clone(), e.into_error()))?;
    buffered.flush().map_err(io)?;
    drop(buffered);
    file.as_file().sync_all().map_err(io)?;
    Ok(Staged { file, path })
}

impl KaceDataset {
    /// Writes the workloads (in their order, which fixes pairs.csv's `idx1`/`idx2`) and the
    /// pairs into `dir`, creating it if missing. With [`Overwrite::Refuse`], a folder that
    /// already holds any of the three files is refused before anything is written. Every
    /// pair must name workloads of the dataset (pairs.csv repeats their metrics).
    /// `incomplete_workloads` is not written: the format has no place for it.
    pub fn write(&self, dir: &Path, overwrite: Overwrite) -> Result<KaceWritten, KaceWriteError> {
        let index: HashMap<&str, usize> = self
            .workloads
            .iter()
            .enumerate()
            .map(|(i, w)| (w.name.as_str(), i))
            .collect();
        let mut pair_rows = Vec::with_capacity(self.pairs.len());
        for (row, pair) in self.pairs.iter().enumerate() {
            let position = |name: &str| {
                index
                    .get(name)
                    .copied()
                    .ok_or_else(|| KaceWriteError::UnknownWorkload {
                        row: row + 1,
                        name: name.to_string(),
                    })
            };
            let (i1, i2) = (position(&pair.workload1)?, position(&pair.workload2)?);
            let (w1, w2) = (&self.workloads[i1], &self.workloads[i2]);
            pair_rows.push(PairRow {
                w1_threads: w1.kernel.threads,
                w1_compute: w1.kernel.compute_throughput_pct,
                w1_dram: w1.kernel.dram_throughput_pct,
                w1_memory: w1.kernel.memory_throughput_pct,
                w1_registers: w1.kernel.registers,
                w1_static_shared_memory: w1.kernel.static_shared_memory_bytes,
                w2_threads: w2.kernel.threads,
                w2_compute: w2.kernel.compute_throughput_pct,
                w2_dram: w2.kernel.dram_throughput_pct,
                w2_memory: w2.kernel.memory_throughput_pct,
                w2_registers: w2.kernel.registers,
                w2_static_shared_memory: w2.kernel.static_shared_memory_bytes,
                workload1: &pair.workload1,
                workload2: &pair.workload2,
                idx1: i1 + 1,
                idx2: i2 + 1,
                w1throughput: pair.throughput1,
                w2throughput: pair.throughput2,
                w1exclusive_throughput: w1.system.exclusive_throughput,
                w2exclusive_throughput: w2.system.exclusive_throughput,
                w1_sm_busy: w1.system.sm_busy_pct,
                w2_sm_busy: w2.system.sm_busy_pct,
                w1_mem_busy: w1.system.mem_busy_pct,
                w2_mem_busy: w2.system.mem_busy_pct,
                w1memcap: w1.system.memory_gb,
                w2memcap: w2.system.memory_gb,
            });
        }

        match fs::metadata(dir) {
            Ok(metadata) if !metadata.is_dir() => {
                return Err(KaceWriteError::NotAFolder(dir.to_path_buf()))
            }
            Ok(_) => {}
            Err(_) => fs::create_dir_all(dir)
                .map_err(|e| KaceWriteError::CreateFolder(dir.to_path_buf(), e))?,
        }
        if overwrite == Overwrite::Refuse {
            if let Some(existing) = KACE_FILES
                .iter()
                .map(|name| dir.join(name))
                .find(|path| fs::symlink_metadata(path).is_ok())
            {
                return Err(KaceWriteError::Exists(existing));
            }
        }

        let staged = [
            stage(
                dir,
                KACE_FILES[0],
                SYSTEM_HEADER,
                self.workloads.iter().map(system_row),
            )?,
            stage(dir, KACE_FILES[1], PAIRS_HEADER, pair_rows)?,
            stage(
                dir,
                KACE_FILES[2],
                KERNEL_HEADER,
                self.workloads.iter().map(kernel_row),
            )?,
        ];
        for Staged { file, path } in staged {
            let persisted = match overwrite {
                // No-clobber: a file created since the check above is not replaced either.
                Overwrite::Refuse => file.persist_noclobber(&path),
                Overwrite::Replace => file.persist(&path),
            };
            persisted.map_err(|e| match e.error.kind() {
                std::io::ErrorKind::AlreadyExists => KaceWriteError::Exists(path.clone()),
                _ => KaceWriteError::Io(path.clone(), e.error),
            })?;
        }
        // The renames themselves reach the disk with the folder's metadata.
        fs::File::open(dir)
            .and_then(|folder| folder.sync_all())
            .map_err(|e| KaceWriteError::Io(dir.to_path_buf(), e))?;
        Ok(KaceWritten {
            workloads: self.workloads.len(),
            pairs: self.pairs.len(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        dataset::{parse_workload_name, KacePair},
        domain::{KernelMetrics, SystemMetrics, WorkloadName},
    };

    fn workload(name: &str, seed: f64) -> KaceWorkload {
        let (model, batch_size, mode) = parse_workload_name(name);
        KaceWorkload {
            name: WorkloadName::parse("workload", name).unwrap(),
            mode,
            model,
            batch_size,
            kernel: KernelMetrics {
                threads: 4277649.00888219 * seed,
                compute_throughput_pct: 0.1 + 0.2,
                dram_throughput_pct: 1e-7 * seed,
                memory_throughput_pct: 100.0 / 3.0,
                registers: 5e-324,
                static_shared_memory_bytes: 1.7976931348623157e300 * seed,
            },
            system: SystemMetrics {
                exclusive_throughput: std::f64::consts::PI * seed,
                throughput_unit: String::new(),
                sm_busy_pct: 96.0,
                mem_busy_pct: 2.0_f64.sqrt(),
                memory_gb: 1.4,
            },
        }
    }

    fn dataset() -> KaceDataset {
        KaceDataset {
            workloads: vec![
                workload("a_batch2-inf", 1.0),
                workload("b.x:y+z/w_batch8-train", 1.5),
            ],
            pairs: vec![
                KacePair {
                    workload1: "b.x:y+z/w_batch8-train".into(),
                    workload2: "a_batch2-inf".into(),
                    throughput1: 1.0 / 7.0,
                    throughput2: 123456.789e-3,
                },
                KacePair {
                    workload1: "a_batch2-inf".into(),
                    workload2: "a_batch2-inf".into(),
                    throughput1: 0.0,
                    throughput2: f64::MIN_POSITIVE,
                },
            ],
            incomplete_workloads: Vec::new(),
        }
    }

    /// The ten metrics (the model's features, all of them), as bits.
    fn bits(w: &KaceWorkload) -> Vec<u64> {
        crate::model::Features::from_metrics(&w.kernel, &w.system)
            .0
            .map(f64::to_bits)
            .to_vec()
    }

    #[test]
    fn a_written_dataset_reads_back_bit_for_bit() {
        let dir = tempfile::tempdir().unwrap();
        let written = dataset();
        assert_eq!(
            written.write(dir.path(), Overwrite::Refuse).unwrap(),
            KaceWritten {
                workloads: 2,
                pairs: 2
            }
        );
        let read = KaceDataset::read(dir.path()).unwrap();
        assert!(read.incomplete_workloads.is_empty());
        assert_eq!(read.workloads.len(), 2);
        for (w, r) in written.workloads.iter().zip(&read.workloads) {
            assert_eq!((w.name.as_str(), bits(w)), (r.name.as_str(), bits(r)));
        }
        assert_eq!(read.pairs.len(), 2);
        for (w, r) in written.pairs.iter().zip(&read.pairs) {
            assert_eq!(
                (
                    &w.workload1,
                    &w.workload2,
                    w.throughput1.to_bits(),
                    w.throughput2.to_bits()
                ),
                (
                    &r.workload1,
                    &r.workload2,
                    r.throughput1.to_bits(),
                    r.throughput2.to_bits()
                )
            );
        }
        // idx1/idx2 are 1-based positions in kernel_metrics.csv; no temporary file is left.
        let pairs = fs::read_to_string(dir.path().join("pairs.csv")).unwrap();
        assert!(pairs.contains(",a_batch2-inf,2,1,"), "{pairs}");
        let mut names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(
            names,
            ["kernel_metrics.csv", "pairs.csv", "system_metrics.csv"]
        );
    }

    #[test]
    fn the_fixed_headers_are_the_rows_own_field_names() {
        let header_of = |row: &dyn Fn(&mut csv::Writer<Vec<u8>>)| {
            let mut writer = csv::Writer::from_writer(Vec::new());
            row(&mut writer);
            let text = String::from_utf8(writer.into_inner().unwrap()).unwrap();
            text.lines().next().unwrap().to_string()
        };
        let data = dataset();
        let w = &data.workloads[0];
        assert_eq!(
            header_of(&|wr| wr.serialize(kernel_row(w)).unwrap()),
            KERNEL_HEADER
        );
        assert_eq!(
            header_of(&|wr| wr.serialize(system_row(w)).unwrap()),
            SYSTEM_HEADER
        );
        let dir = tempfile::tempdir().unwrap();
        data.write(dir.path(), Overwrite::Refuse).unwrap();
        let pairs = fs::read_to_string(dir.path().join("pairs.csv")).unwrap();
        assert_eq!(pairs.lines().next().unwrap(), PAIRS_HEADER);
        // The pair row's own field names, through serde (the header line is written by
        // hand so that an empty file still has one).
        let mut writer = csv::Writer::from_writer(Vec::new());
        let row = PairRow {
            w1_threads: 0.0,
            w1_compute: 0.0,
            w1_dram: 0.0,
            w1_memory: 0.0,
            w1_registers: 0.0,
            w1_static_shared_memory: 0.0,
            w2_threads: 0.0,
            w2_compute: 0.0,
            w2_dram: 0.0,
            w2_memory: 0.0,
            w2_registers: 0.0,
            w2_static_shared_memory: 0.0,
            workload1: "a",
            workload2: "b",
            idx1: 1,
            idx2: 2,
            w1throughput: 0.0,
            w2throughput: 0.0,
            w1exclusive_throughput: 0.0,
            w2exclusive_throughput: 0.0,
            w1_sm_busy: 0.0,
            w2_sm_busy: 0.0,
            w1_mem_busy: 0.0,
            w2_mem_busy: 0.0,
            w1memcap: 0.0,
            w2memcap: 0.0,
        };
        writer.serialize(row).unwrap();
        let text = String::from_utf8(writer.into_inner().unwrap()).unwrap();
        assert_eq!(text.lines().next().unwrap(), PAIRS_HEADER);
    }

    #[test]
    fn an_empty_dataset_still_writes_headers_and_reads_back_empty() {
        let dir = tempfile::tempdir().unwrap();
        let empty = KaceDataset {
            workloads: Vec::new(),
            pairs: Vec::new(),
            incomplete_workloads: Vec::new(),
        };
        empty.write(dir.path(), Overwrite::Refuse).unwrap();
        let read = KaceDataset::read(dir.path()).unwrap();
        assert!(read.workloads.is_empty() && read.pairs.is_empty());
        assert_eq!(
            fs::read_to_string(dir.path().join("system_metrics.csv")).unwrap(),
            format!("{SYSTEM_HEADER}\n")
        );
    }

    #[test]
    fn existing_files_are_refused_untouched_unless_replacing() {
        let dir = tempfile::tempdir().unwrap();
        let pairs = dir.path().join("pairs.csv");
        fs::write(&pairs, "mine").unwrap();
        let error = dataset().write(dir.path(), Overwrite::Refuse).unwrap_err();
        assert!(
            matches!(&error, KaceWriteError::Exists(p) if *p == pairs),
            "{error}"
        );
        assert_eq!(fs::read_to_string(&pairs).unwrap(), "mine");
        assert_eq!(
            fs::read_dir(dir.path()).unwrap().count(),
            1,
            "nothing else written"
        );

        dataset().write(dir.path(), Overwrite::Replace).unwrap();
        assert_eq!(KaceDataset::read(dir.path()).unwrap().pairs.len(), 2);
    }

    #[test]
    fn a_pair_naming_an_unknown_workload_is_refused_before_writing() {
        let dir = tempfile::tempdir().unwrap();
        let mut data = dataset();
        data.pairs[1].workload2 = "ghost".into();
        let error = data
            .write(&dir.path().join("out"), Overwrite::Refuse)
            .unwrap_err();
        assert!(
            matches!(&error, KaceWriteError::UnknownWorkload { row: 2, name } if name == "ghost"),
            "{error}"
        );
        assert!(!dir.path().join("out").exists());
    }
}
