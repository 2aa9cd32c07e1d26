//! The checkpoint of a search: `journal.jsonl` in its results folder, one line per
//! evaluated candidate, appended and synced as the search goes, so that a search
//! interrupted by kill -9, power loss, SIGTERM or Ctrl-C continues where it was instead of
//! starting again.
//!
//! The first line says which search it belongs to (spec content, archplace version, the
//! cost models); a journal of anything else is set aside and a new one started. A line torn
//! by the interruption is dropped (and cut off, so later appends follow whole lines). The
//! journal is removed once the complete results are written.

use archplace_engine::search::Evaluated;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

pub const FILE: &str = "journal.jsonl";

/// What a journal belongs to: its first line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Header {
    pub journal_format: u32,
    pub content_hash: String,
    pub archplace_version: String,
    /// The cost models' identities (name, version and what they were loaded from).
    pub cost_models: serde_json::Value,
}

/// An open journal, appending.
pub struct Journal {
    file: File,
    path: PathBuf,
}

impl Journal {
    /// Opens `dir/journal.jsonl` for `header`: the candidates it already holds (by index,
    /// summarised: see `Evaluated::summarise`), and the journal to append to.
    pub fn open(
        dir: &Path,
        header: &Header,
    ) -> std::io::Result<(Journal, BTreeMap<usize, Evaluated>)> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join(FILE);
        let mut done = BTreeMap::new();
        let mut keep = 0u64;
        if let Ok(file) = File::open(&path) {
            let mut reader = BufReader::new(file);
            let mut line = String::new();
            let mut first = true;
            let mut at = 0u64;
            loop {
                line.clear();
                let n = reader.read_line(&mut line)?;
                if n == 0 || !line.ends_with('\n') {
                    break; // the end, or a line the interruption tore
                }
                if first {
                    first = false;
                    match serde_json::from_str::<Header>(&line) {
                        Ok(h) if h == *header => {}
                        _ => {
                            tracing::info!(path = %path.display(), "a journal of another search: starting a new one");
                            break;
                        }
                    }
                } else {
                    match serde_json::from_str::<Evaluated>(&line) {
                        Ok(mut e) => {
                            // Summaries: a resumed search holds what an uninterrupted one
                            // does per candidate, and evaluates its best again if needed.
                            e.summarise();
                            done.insert(e.index, e);
                        }
                        Err(_) => break,
                    }
                }
                at += n as u64;
                keep = at;
            }
        }
        let mut file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&path)?;
        file.set_len(keep)?;
        file.seek(SeekFrom::End(0))?;
        let mut journal = Journal { file, path };
        if keep == 0 {
            done.clear();
            journal.append(&serde_json::to_vec(header).map_err(std::io::Error::other)?)?;
        } else if !done.is_empty() {
            tracing::info!(path = %journal.path.display(), candidates = done.len(), "resuming from the journal");
        }
        Ok((journal, done))
    }

    /// Appends one evaluated candidate, synced before it returns.
    pub fn record(&mut self, e: &Evaluated) -> std::io::Result<()> {
        let line = serde_json::to_vec(e).map_err(std::io::Error::other)?;
        self.append(&line)
    }

    fn append(&mut self, line: &[u8]) -> std::io::Result<()> {
        let mut buf = Vec::with_capacity(line.len() + 1);
        buf.extend_from_slice(line);
        buf.push(b'\n');
        self.file.write_all(&buf)?;
        self.file.sync_data()
    }
}

/// The candidates the journal of `dir` holds: its whole lines after the header (0 without
/// a journal). How the daemon tells a search that made progress before an interruption
/// from one that did not.
pub fn candidates(dir: &Path) -> u64 {
    use std::io::Read;
    let Ok(mut file) = File::open(dir.join(FILE)) else {
        return 0;
    };
    // Whole lines end in a newline; a line the interruption tore does not count.
    let (mut newlines, mut buf) = (0u64, vec![0u8; 1 << 16]);
    while let Ok(n) = file.read(&mut buf) {
        if n == 0 {
            break;
        }
        newlines += buf[..n].iter().filter(|&&b| b == b'\n').count() as u64;
    }
    newlines.saturating_sub(1)
}

/// Removes the journal of `dir` (its search's results are complete).
pub fn remove(dir: &Path) {
    let _ = std::fs::remove_file(dir.join(FILE));
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)]
mod tests {
    use super::*;
    use archplace_plugin_sdk::AcceleratorConfig;

    fn header(hash: &str) -> Header {
        Header {
            journal_format: 1,
            content_hash: hash.into(),
            archplace_version: "0".into(),
            cost_models: serde_json::json!({"area": "reference"}),
        }
    }

    fn evaluated(index: usize) -> Evaluated {
        Evaluated {
            index,
            config: AcceleratorConfig {
                tensor_cores: 2,
                vector_cores: 2,
                width: 16,
                depth: 16,
                vector_width: 64,
                buffer_bytes: 1 << 21,
            },
            area_um2: 0.1 + index as f64 / 3.0,
            bucket: 1,
            mean_throughput_samples_per_second: Some(1.0 / 3.0 + index as f64),
            hbm_bytes: Some(1 << 34),
            plans: vec![],
            failure: None,
            node_size: None,
            domains: Vec::new(),
        }
    }

    #[test]
    fn candidates_survive_a_torn_line_and_another_search_starts_afresh() {
        let dir = tempfile::tempdir().unwrap();
        let (mut j, done) = Journal::open(dir.path(), &header("a")).unwrap();
        assert!(done.is_empty());
        for i in 0..3 {
            j.record(&evaluated(i)).unwrap();
        }
        drop(j);
        // A kill in the middle of the fourth line.
        let path = dir.path().join(FILE);
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(b"{\"index\":3,\"con").unwrap();
        drop(f);
        let (mut j, done) = Journal::open(dir.path(), &header("a")).unwrap();
        assert_eq!(done.len(), 3);
        assert_eq!(done[&2], evaluated(2), "values round-trip exactly");
        j.record(&evaluated(3)).unwrap();
        drop(j);
        let (_, done) = Journal::open(dir.path(), &header("a")).unwrap();
        assert_eq!(done.keys().copied().collect::<Vec<_>>(), [0, 1, 2, 3]);
        // Another spec content: nothing reused, the journal restarted.
        let (_, done) = Journal::open(dir.path(), &header("b")).unwrap();
        assert!(done.is_empty());
        let (_, done) = Journal::open(dir.path(), &header("b")).unwrap();
        assert!(done.is_empty());
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 1, "{text}");
    }

    /// The candidates a journal holds: whole lines after the header; a torn last line and a
    /// missing journal count nothing.
    #[test]
    fn candidates_are_the_whole_lines_after_the_header() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(candidates(dir.path()), 0);
        let (mut j, _) = Journal::open(dir.path(), &header("a")).unwrap();
        assert_eq!(candidates(dir.path()), 0);
        j.record(&evaluated(0)).unwrap();
        j.record(&evaluated(1)).unwrap();
        assert_eq!(candidates(dir.path()), 2);
        std::fs::OpenOptions::new()
            .append(true)
            .open(dir.path().join(FILE))
            .and_then(|mut f| f.write_all(b"{\"index\": 2, \"torn"))
            .unwrap();
        assert_eq!(candidates(dir.path()), 2);
    }
}
