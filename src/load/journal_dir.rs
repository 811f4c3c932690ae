//! Where the journal of a load run lives (`--journal DIR`): every engine phase opens its journal
//! in a fresh subdirectory of DIR, so each starts empty, and that subdirectory is removed when
//! the phase's engine is gone. Session ids restart at `s1` with every engine and the workload's
//! call ids repeat, so a phase on an old journal would be answered from it instead of running.
//!
//! Nothing is removed that the run did not create: DIR is created if missing (not its parents)
//! and, if it was, removed at the end only when it is empty again; a DIR that existed is left as it was.

use std::path::{Path, PathBuf};

/// The `--journal DIR` of a run.
#[derive(Debug)]
pub struct JournalRoot {
    dir: PathBuf,
    /// True when this run created `dir`.
    created: bool,
}

impl JournalRoot {
    /// Opens `dir`, creating it if missing (its parent must exist).
    pub fn open(dir: &Path) -> Result<JournalRoot, String> {
        if dir.exists() && !dir.is_dir() {
            return Err(format!("--journal {}: not a directory", dir.display()));
        }
        let created = !dir.exists();
        if created {
            std::fs::create_dir(dir)
                .map_err(|e| format!("--journal {}: cannot create it: {e}", dir.display()))?;
        }
        Ok(JournalRoot {
            dir: dir.to_path_buf(),
            created,
        })
    }

    /// A fresh, empty subdirectory for one phase's journal, removed when the guard is dropped.
    pub fn phase_dir(&self) -> Result<tempfile::TempDir, String> {
        tempfile::Builder::new()
            .prefix("switchboard-journal-")
            .tempdir_in(&self.dir)
            .map_err(|e| {
                format!(
                    "--journal {}: cannot create a journal directory in it: {e}",
                    self.dir.display()
                )
            })
    }
}

impl Drop for JournalRoot {
    fn drop(&mut self) {
        if self.created {
            // Fails, and so keeps it, if anything else was put there meanwhile.
            let _ = std::fs::remove_dir(&self.dir);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_the_run_created_goes_and_one_it_found_stays() {
        let parent = tempfile::tempdir().unwrap();
        let made = parent.path().join("jb");
        {
            let root = JournalRoot::open(&made).unwrap();
            let phase = root.phase_dir().unwrap();
            std::fs::write(phase.path().join("journal.redb"), b"x").unwrap();
            let other = root.phase_dir().unwrap();
            assert_ne!(phase.path(), other.path());
        }
        assert!(!made.exists(), "the run created it and left it empty");
        assert!(JournalRoot::open(&parent.path().join("no/such")).is_err());

        let found = parent.path().join("found");
        std::fs::create_dir(&found).unwrap();
        drop(JournalRoot::open(&found).unwrap().phase_dir().unwrap());
        assert!(found.exists());
        assert_eq!(std::fs::read_dir(&found).unwrap().count(), 0);
    }

    #[test]
    fn a_file_is_refused_as_the_directory() {
        let parent = tempfile::tempdir().unwrap();
        let file = parent.path().join("f");
        std::fs::write(&file, b"").unwrap();
        let e = JournalRoot::open(&file).unwrap_err();
        assert!(
            e.contains("--journal") && e.contains("not a directory"),
            "{e}"
        );
    }
}
