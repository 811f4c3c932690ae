//! The other names of a hard-linked file inside a workspace, so that a deny rule on one name
//! holds for all of them (see `Policy::denied_by_another_name`).

use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Entries looked at, at most, in one search.
pub const MAX_ENTRIES: usize = 100_000;

/// Every workspace-relative, `/`-separated name below `root` of the file `(dev, ino)`, found by a
/// walk that follows no symlink and leaves the device; `Err` when the workspace holds more than
/// [`MAX_ENTRIES`] entries (the search would be incomplete).
pub fn other_names(root: &Path, dev: u64, ino: u64) -> Result<Vec<String>, String> {
    let mut names = Vec::new();
    let mut seen = 0usize;
    let mut stack = vec![(root.to_path_buf(), String::new())];
    while let Some((dir, rel)) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            seen += 1;
            if seen > MAX_ENTRIES {
                return Err(format!("the workspace has over {MAX_ENTRIES} entries"));
            }
            let Ok(meta) = entry.metadata() else { continue };
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            if meta.is_dir() {
                if meta.dev() == dev {
                    stack.push((entry.path(), path));
                }
            } else if meta.dev() == dev && meta.ino() == ino {
                names.push(path);
            }
        }
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_of_a_linked_file_is_found() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("a/b")).unwrap();
        std::fs::write(tmp.path().join("a/b/secret"), "s").unwrap();
        std::fs::hard_link(tmp.path().join("a/b/secret"), tmp.path().join("alias")).unwrap();
        std::fs::write(tmp.path().join("other"), "o").unwrap();
        std::os::unix::fs::symlink(tmp.path().join("a/b/secret"), tmp.path().join("sym")).unwrap();
        let meta = std::fs::metadata(tmp.path().join("alias")).unwrap();
        let mut names = other_names(tmp.path(), meta.dev(), meta.ino()).unwrap();
        names.sort();
        assert_eq!(names, ["a/b/secret", "alias"]);
    }
}
