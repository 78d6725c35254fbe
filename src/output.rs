//! Output files, all or nothing ([`OutputFile`] for one file opened before a run, such as
//! `--logits-out`): [`check_writable`] before any work starts (so a bad
//! `--out` costs nothing), then [`write_all`], which stages every file to a temporary
//! sibling, renames them into place at the end, and on any failure removes what it staged,
//! puts back every file it had already replaced and removes the directories it created.

use std::path::{Path, PathBuf};

/// Whether `names` can be written into `dir`: `dir` is a directory or can be created (the
/// nearest existing ancestor is a directory), and each name is a plain file name whose
/// path is not a directory. Creates nothing.
pub fn check_writable<N: AsRef<str>>(dir: &Path, names: &[N]) -> Result<(), String> {
    let mut ancestor = dir;
    loop {
        match std::fs::metadata(ancestor) {
            Ok(m) if m.is_dir() => break,
            Ok(_) => {
                return Err(format!(
                    "cannot write into {}: {} is not a folder",
                    dir.display(),
                    ancestor.display()
                ));
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
                ) =>
            {
                match ancestor.parent() {
                    Some(p) if !p.as_os_str().is_empty() => ancestor = p,
                    _ => break, // a relative path: its first component is created in the working directory
                }
            }
            Err(e) => {
                return Err(format!(
                    "cannot write into {}: {}: {e}",
                    dir.display(),
                    ancestor.display()
                ));
            }
        }
    }
    for (i, name) in names.iter().enumerate() {
        let name = name.as_ref();
        if name.is_empty() || name.contains(['/', '\\']) || name == "." || name == ".." {
            return Err(format!("output name `{name}` is not a plain file name"));
        }
        if names[..i].iter().any(|n| n.as_ref() == name) {
            return Err(format!("output `{name}` is named twice"));
        }
        let path = dir.join(name);
        if path.is_dir() {
            return Err(format!(
                "{} is a folder, cannot write the file {name} there",
                path.display()
            ));
        }
    }
    Ok(())
}

/// The directories `create_dir_all(dir)` would create, outermost first.
fn missing_dirs(dir: &Path) -> Vec<PathBuf> {
    let mut missing: Vec<PathBuf> = dir
        .ancestors()
        .take_while(|a| !a.as_os_str().is_empty() && !a.exists())
        .map(Path::to_path_buf)
        .collect();
    missing.reverse();
    missing
}

/// A temporary sibling of `dir/name` (hidden, tagged with the process id).
fn sibling(dir: &Path, name: &str, tag: &str) -> PathBuf {
    dir.join(format!(".{name}.{}.{tag}", std::process::id()))
}

/// Write every file `(name, bytes)` into `dir`, or none: see the module docs.
pub fn write_all<N: AsRef<str>, B: AsRef<[u8]>>(
    dir: &Path,
    files: &[(N, B)],
) -> Result<(), String> {
    let names: Vec<&str> = files.iter().map(|(n, _)| n.as_ref()).collect();
    check_writable(dir, &names)?;
    let created = missing_dirs(dir);
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let mut txn = Transaction { dir, staged: Vec::new(), committed: Vec::new(), created };
    let result = txn.run(files);
    if result.is_err() {
        txn.roll_back();
    }
    result
}

struct Transaction<'a> {
    dir: &'a Path,
    /// Temporary files written, not yet renamed.
    staged: Vec<PathBuf>,
    /// Files renamed into place, with the backup of the file each replaced.
    committed: Vec<(PathBuf, Option<PathBuf>)>,
    /// Directories created for the output, outermost first.
    created: Vec<PathBuf>,
}

impl Transaction<'_> {
    fn run<N: AsRef<str>, B: AsRef<[u8]>>(&mut self, files: &[(N, B)]) -> Result<(), String> {
        for (name, bytes) in files {
            let tmp = sibling(self.dir, name.as_ref(), "partial");
            self.staged.push(tmp.clone());
            std::fs::write(&tmp, bytes)
                .map_err(|e| format!("cannot write {}: {e}", tmp.display()))?;
        }
        for (name, _) in files {
            let name = name.as_ref();
            let (tmp, dest) = (self.staged.remove(0), self.dir.join(name));
            if dest.is_dir() {
                self.staged.insert(0, tmp);
                return Err(format!(
                    "{} is a folder, cannot write the file {name} there",
                    dest.display()
                ));
            }
            let backup = if dest.exists() {
                let b = sibling(self.dir, name, "orig");
                std::fs::rename(&dest, &b)
                    .map_err(|e| format!("cannot replace {}: {e}", dest.display()))?;
                Some(b)
            } else {
                None
            };
            if let Err(e) = std::fs::rename(&tmp, &dest) {
                self.staged.insert(0, tmp);
                if let Some(b) = backup {
                    let _ = std::fs::rename(b, &dest);
                }
                return Err(format!("cannot write {}: {e}", dest.display()));
            }
            self.committed.push((dest, backup));
        }
        for (_, backup) in &self.committed {
            if let Some(b) = backup {
                let _ = std::fs::remove_file(b);
            }
        }
        Ok(())
    }

    /// Undo everything: staged files removed, replaced files restored, new ones removed,
    /// created directories removed (only if empty: nothing else is touched).
    fn roll_back(&mut self) {
        for tmp in self.staged.drain(..) {
            let _ = std::fs::remove_file(tmp);
        }
        for (dest, backup) in self.committed.drain(..).rev() {
            let _ = std::fs::remove_file(&dest);
            if let Some(b) = backup {
                let _ = std::fs::rename(b, &dest);
            }
        }
        for d in self.created.iter().rev() {
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// A file written all or nothing: created as a temporary sibling when the run starts (so a
/// bad path fails before any work), renamed over the destination by [`Self::commit`],
/// removed if dropped uncommitted. A destination that exists and is neither a regular file
/// nor a folder (`/dev/null`, a FIFO) is opened and written in place instead: renaming over
/// it would replace the device with a regular file.
#[derive(Debug)]
pub struct OutputFile {
    dest: PathBuf,
    /// The temporary sibling; `None` when writing into a special file in place.
    tmp: Option<PathBuf>,
    file: Option<std::fs::File>,
}

impl OutputFile {
    /// Checks `dest` can be written (its folder exists, it is not a folder) by creating the
    /// temporary sibling `.NAME.PID.partial`.
    pub fn create(flag: &str, dest: &Path) -> Result<Self, String> {
        let bad = |why: String| format!("{flag} {}: {why}", dest.display());
        if dest.is_dir() {
            return Err(bad("is a directory".into()));
        }
        if std::fs::metadata(dest).is_ok_and(|m| !m.is_file()) {
            let file = std::fs::OpenOptions::new()
                .write(true)
                .open(dest)
                .map_err(|e| bad(format!("cannot write here: {e}")))?;
            return Ok(Self { dest: dest.to_path_buf(), tmp: None, file: Some(file) });
        }
        let name = dest.file_name().ok_or_else(|| bad("not a file name".into()))?.to_string_lossy();
        let folder = dest.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        if !folder.is_dir() {
            return Err(bad(format!("the folder {} does not exist", folder.display())));
        }
        // The process id keeps two runs writing the same file from sharing a temporary.
        let tmp = folder.join(format!(".{name}.{}.partial", std::process::id()));
        let file =
            std::fs::File::create(&tmp).map_err(|e| bad(format!("cannot write here: {e}")))?;
        Ok(Self { dest: dest.to_path_buf(), tmp: Some(tmp), file: Some(file) })
    }

    /// Writes `bytes` and renames the file into place.
    pub fn commit(mut self, bytes: &[u8]) -> Result<(), String> {
        use std::io::Write;
        let mut file = self.file.take().expect("committed once");
        let written = match &self.tmp {
            Some(tmp) => file
                .write_all(bytes)
                .and_then(|()| file.sync_all())
                .and_then(|()| std::fs::rename(tmp, &self.dest)),
            None => file.write_all(bytes),
        };
        written.map_err(|e| format!("cannot write {}: {e}", self.dest.display()))
    }
}

impl Drop for OutputFile {
    fn drop(&mut self) {
        // Uncommitted, or the commit failed: leave nothing behind (after a commit the
        // temporary name is gone already).
        if let Some(tmp) = &self.tmp {
            let _ = std::fs::remove_file(tmp);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh folder under the system temp dir, removed when the test ends (pass or fail).
    struct Scratch(PathBuf);

    impl std::ops::Deref for Scratch {
        type Target = PathBuf;
        fn deref(&self) -> &PathBuf {
            &self.0
        }
    }

    impl AsRef<Path> for Scratch {
        fn as_ref(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn scratch(name: &str) -> Scratch {
        let d =
            std::env::temp_dir().join(format!("palladium-output-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        Scratch(d)
    }

    fn listing(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_special_file_is_written_in_place_not_replaced() {
        let dev_null = Path::new("/dev/null");
        let before = std::fs::metadata(dev_null).expect("/dev/null").file_type();
        OutputFile::create("--logits-out", dev_null)
            .expect("opens")
            .commit(b"logits")
            .expect("writes");
        let after = std::fs::metadata(dev_null).expect("/dev/null").file_type();
        assert!(!after.is_file(), "/dev/null was replaced by a regular file");
        assert_eq!(before.is_file(), after.is_file());
    }

    #[test]
    fn writes_every_file_and_creates_the_directory() {
        let scratch = scratch("ok");
        let d = scratch.join("a/b");
        write_all(&d, &[("x.txt", "one"), ("y.txt", "two")]).unwrap();
        assert_eq!(listing(&d), ["x.txt", "y.txt"]);
        assert_eq!(std::fs::read_to_string(d.join("y.txt")).unwrap(), "two");
        // Replacing existing files leaves no backups behind.
        write_all(&d, &[("x.txt", "three")]).unwrap();
        assert_eq!(listing(&d), ["x.txt", "y.txt"]);
        assert_eq!(std::fs::read_to_string(d.join("x.txt")).unwrap(), "three");
    }

    #[test]
    fn a_directory_in_the_way_is_refused_before_anything_is_written() {
        let d = scratch("dir_in_the_way");
        std::fs::create_dir_all(d.join("b.txt/keep")).unwrap();
        let err = check_writable(&d, &["a.txt", "b.txt"]).unwrap_err();
        assert!(err.contains("b.txt is a folder"), "{err}");
        assert!(write_all(&d, &[("a.txt", "1"), ("b.txt", "2")]).is_err());
        assert_eq!(listing(&d), ["b.txt"]);
        let file = d.join("b.txt/keep/f");
        std::fs::write(&file, "").unwrap();
        let err = check_writable(&file.join("sub"), &["a.txt"]).unwrap_err();
        assert!(err.contains("is not a folder"), "{err}");
        assert!(check_writable(&d, &["../x"]).unwrap_err().contains("not a plain file name"));
        assert!(check_writable(&d, &["a", "a"]).unwrap_err().contains("named twice"));
    }

    #[test]
    fn a_failure_while_renaming_restores_every_replaced_file() {
        let d = scratch("rollback");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("a.txt"), "old a").unwrap();
        // Passes the up-front check, then a directory appears where `b.txt` goes (a race
        // with another process): `a.txt` was already replaced and must come back.
        let created = missing_dirs(&d);
        let mut txn = Transaction { dir: &d, staged: Vec::new(), committed: Vec::new(), created };
        std::fs::create_dir(d.join("b.txt")).unwrap();
        let err = txn.run(&[("a.txt", "new a"), ("b.txt", "new b")]).unwrap_err();
        txn.roll_back();
        assert!(err.contains("b.txt is a folder"), "{err}");
        assert_eq!(listing(&d), ["a.txt", "b.txt"]);
        assert_eq!(std::fs::read_to_string(d.join("a.txt")).unwrap(), "old a");
    }

    #[test]
    fn directories_created_for_a_failed_write_are_removed() {
        let base = scratch("created");
        std::fs::create_dir_all(&base).unwrap();
        let d = base.join("new/deeper");
        let created = missing_dirs(&d);
        std::fs::create_dir_all(&d).unwrap();
        let mut txn = Transaction { dir: &d, staged: Vec::new(), committed: Vec::new(), created };
        std::fs::create_dir(d.join("b.txt")).unwrap();
        assert!(txn.run(&[("a.txt", "1"), ("b.txt", "2")]).is_err());
        std::fs::remove_dir(d.join("b.txt")).unwrap();
        txn.roll_back();
        assert!(listing(&base).is_empty(), "{:?}", listing(&base));
    }
}
