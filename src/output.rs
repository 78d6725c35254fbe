//! Output files: checked before any work, written all or nothing, never over an input.
//!
//! - [`OutputFolder`] (`--out DIR` of `emit`, `compile`, `megakernel`, `profile`):
//!   [`OutputFolder::check`] before any work starts (so a bad `--out` costs nothing), then
//!   [`OutputFolder::write`], which stages every file to a temporary sibling, renames them
//!   into place at the end and removes the files of the command's own set it did not write
//!   this time (an earlier run's, which would otherwise sit beside the new ones as if they
//!   belonged to them); on any failure it removes what it staged, puts back every file it had
//!   replaced or removed and removes the directories it created.
//! - [`OutputFile`]: one file opened before a run (`--logits-out`), renamed into place at
//!   the end.
//!
//! Both refuse, before any work, an output that is one of the command's [`Input`]s (the
//! same file: device and inode, so through symlinks and hard links too). A symlinked output,
//! even a dangling one, is written through: the temporary goes beside the link's final
//! target and is renamed onto it, so the link stays a link. A destination that exists and is
//! neither a regular file nor a folder (`/dev/null`, a FIFO) is written in place: renaming
//! over it would replace the device with a regular file.

use std::path::{Path, PathBuf};

/// A file a command reads, with what it is to the command: named when an output would
/// replace it.
#[derive(Clone, Debug)]
pub struct Input {
    /// e.g. "the config", "the checkpoint file".
    pub what: String,
    pub path: PathBuf,
}

impl Input {
    pub fn new(what: impl Into<String>, path: impl Into<PathBuf>) -> Self {
        Self { what: what.into(), path: path.into() }
    }
}

/// A regular file's identity (device, inode), through symlinks: equal for every path and
/// hard link of one file. `None` for anything else (missing, a folder, a device: writing a
/// device replaces nothing).
fn identity(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().filter(std::fs::Metadata::is_file).map(|m| (m.dev(), m.ino()))
}

/// Refuses writing `output` (`label` in the error: the flag and what it names) when it is
/// the same file as one of `inputs`.
fn refuse_inputs(label: &str, output: &Path, inputs: &[Input]) -> Result<(), String> {
    let Some(id) = identity(output) else { return Ok(()) };
    match inputs.iter().find(|i| identity(&i.path) == Some(id)) {
        None => Ok(()),
        Some(i) => Err(format!(
            "{label}: {} is {} {}, which this command reads: an output never replaces an input; write it elsewhere",
            output.display(),
            i.what,
            i.path.display()
        )),
    }
}

/// Where writing `path` lands: `path` itself, or the final target of the symlink it is
/// (through a chain of links, each relative target resolved against its link's folder;
/// the target need not exist).
fn final_target(path: &Path) -> Result<PathBuf, String> {
    let mut p = path.to_path_buf();
    // As the kernel's limit on links followed in one lookup.
    for _ in 0..40 {
        match std::fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_symlink() => {
                let to = std::fs::read_link(&p)
                    .map_err(|e| format!("cannot read the link {}: {e}", p.display()))?;
                p = p.parent().map_or_else(|| to.clone(), |dir| dir.join(&to));
            }
            _ => return Ok(p),
        }
    }
    Err(format!("{}: too many levels of symbolic links", path.display()))
}

/// The folder a file `path` goes in ("." for a bare name).
fn folder_of(path: &Path) -> &Path {
    path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."))
}

/// `dir` if it exists, else its nearest existing ancestor: the folder `create_dir_all(dir)`
/// creates in. Refused when that is not a folder.
fn existing_ancestor(dir: &Path) -> Result<&Path, String> {
    let mut ancestor = dir;
    loop {
        match std::fs::metadata(ancestor) {
            Ok(m) if m.is_dir() => return Ok(ancestor),
            Ok(_) => return Err(format!("{} is not a folder", ancestor.display())),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
                ) =>
            {
                match ancestor.parent() {
                    Some(p) if !p.as_os_str().is_empty() => ancestor = p,
                    // A relative path: its first component is created in the working folder.
                    _ => return Ok(Path::new(".")),
                }
            }
            Err(e) => return Err(format!("{}: {e}", ancestor.display())),
        }
    }
}

/// Whether a file can be created in the existing folder `folder`: one is created and removed
/// (permission bits do not say: root, ACLs, read-only mounts).
fn probe_writable(folder: &Path) -> Result<(), String> {
    let probe = sibling(folder, "palladium-probe", "probe");
    match std::fs::OpenOptions::new().write(true).create_new(true).open(&probe) {
        Ok(_) => {
            let _ = std::fs::remove_file(&probe);
            Ok(())
        }
        Err(e) => Err(format!("{} does not take new files: {e}", folder.display())),
    }
}

/// A temporary sibling of `dir/name` (hidden, tagged with the process id, which keeps two
/// runs writing the same file from sharing one).
fn sibling(dir: &Path, name: &str, tag: &str) -> PathBuf {
    dir.join(format!(".{name}.{}.{tag}", std::process::id()))
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

/// Whether `path` exists and is neither a regular file nor a folder (through symlinks): a
/// device or a FIFO, written in place.
fn is_special(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| !m.is_file() && !m.is_dir())
}

/// A command's output folder and its file set (see the module docs).
#[derive(Debug)]
pub struct OutputFolder {
    /// The flag that named the folder (`--out`), for errors.
    flag: String,
    dir: PathBuf,
    /// Every file the command can write here; a run writes some of them and removes the rest.
    file_set: Vec<String>,
    inputs: Vec<Input>,
}

impl OutputFolder {
    /// Checks, before any work and creating nothing, that the command's `file_set` can be
    /// written into `dir` (named by `flag`): `dir` is a folder or can be created (its
    /// nearest existing ancestor is a folder that takes new files), each name is a plain
    /// file name, what it names (or its link's final target) is not a folder nor any of
    /// `inputs`, and a link's target lies in an existing folder that takes new files.
    pub fn check<N: AsRef<str>>(
        flag: &str,
        dir: &Path,
        file_set: &[N],
        inputs: &[Input],
    ) -> Result<Self, String> {
        let bad = |why: String| format!("cannot write into {flag} {}: {why}", dir.display());
        probe_writable(existing_ancestor(dir).map_err(bad)?).map_err(bad)?;
        let names: Vec<&str> = file_set.iter().map(AsRef::as_ref).collect();
        let mut targets: Vec<PathBuf> = Vec::with_capacity(names.len());
        for (i, &name) in names.iter().enumerate() {
            if name.is_empty() || name.contains(['/', '\\']) || name == "." || name == ".." {
                return Err(format!("output name `{name}` is not a plain file name"));
            }
            if names[..i].contains(&name) {
                return Err(format!("output `{name}` is named twice"));
            }
            let path = dir.join(name);
            refuse_inputs(&format!("{flag} {}", dir.display()), &path, inputs)?;
            let target = final_target(&path).map_err(bad)?;
            if target.is_dir() {
                return Err(format!(
                    "{} is a folder, cannot write the file {name} there",
                    path.display()
                ));
            }
            if let Some(j) = targets.iter().position(|t| *t == target) {
                return Err(bad(format!(
                    "{} and {} are links to the same file {}",
                    names[j],
                    name,
                    target.display()
                )));
            }
            if target != path {
                let folder = folder_of(&target);
                if existing_ancestor(folder).map_err(bad)? != folder {
                    return Err(bad(format!(
                        "{} links to {}, whose folder does not exist",
                        path.display(),
                        target.display()
                    )));
                }
                probe_writable(folder).map_err(bad)?;
            }
            targets.push(target);
        }
        Ok(Self {
            flag: flag.to_string(),
            dir: dir.to_path_buf(),
            file_set: names.into_iter().map(String::from).collect(),
            inputs: inputs.to_vec(),
        })
    }

    /// The folder, as given.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Writes every file `(name, bytes)` (names of the file set) and removes the rest of the
    /// file set where an earlier run left them (regular files, or the links themselves; a
    /// device or FIFO stays), all or nothing: see the module docs.
    pub fn write<N: AsRef<str>, B: AsRef<[u8]>>(&self, files: &[(N, B)]) -> Result<(), String> {
        if let Some((name, _)) =
            files.iter().find(|(n, _)| !self.file_set.iter().any(|s| s == n.as_ref()))
        {
            return Err(format!(
                "output `{}` is not in the file set of {}",
                name.as_ref(),
                self.flag
            ));
        }
        // Again: the folder may have changed while the command worked.
        Self::check(&self.flag, &self.dir, &self.file_set, &self.inputs)?;
        let stale: Vec<&str> = self
            .file_set
            .iter()
            .map(String::as_str)
            .filter(|s| !files.iter().any(|(n, _)| n.as_ref() == *s))
            .collect();
        let created = missing_dirs(&self.dir);
        std::fs::create_dir_all(&self.dir)
            .map_err(|e| format!("cannot create {}: {e}", self.dir.display()))?;
        let mut txn = Transaction { staged: Vec::new(), done: Vec::new(), created };
        let result = txn.run(&self.dir, files, &stale);
        if result.is_err() {
            txn.roll_back();
        }
        result
    }
}

struct Transaction {
    /// Temporary files written, not yet renamed: (the temporary, the path it replaces).
    staged: Vec<(PathBuf, PathBuf)>,
    /// Paths written or removed, with the backup of the file each replaced or removed.
    done: Vec<(PathBuf, Option<PathBuf>)>,
    /// Directories created for the output, outermost first.
    created: Vec<PathBuf>,
}

impl Transaction {
    fn run<N: AsRef<str>, B: AsRef<[u8]>>(
        &mut self,
        dir: &Path,
        files: &[(N, B)],
        stale: &[&str],
    ) -> Result<(), String> {
        let mut in_place = Vec::new();
        for (name, bytes) in files {
            let target = final_target(&dir.join(name.as_ref()))?;
            if is_special(&target) {
                in_place.push((target, bytes));
                continue;
            }
            let target_name = target.file_name().map(|n| n.to_string_lossy().into_owned());
            let tmp = sibling(folder_of(&target), &target_name.unwrap_or_default(), "partial");
            self.staged.push((tmp.clone(), target));
            std::fs::write(&tmp, bytes)
                .map_err(|e| format!("cannot write {}: {e}", tmp.display()))?;
        }
        while !self.staged.is_empty() {
            let (tmp, target) = self.staged[0].clone();
            if target.is_dir() {
                return Err(format!("{} is a folder, cannot write a file there", target.display()));
            }
            let backup = self.set_aside(&target)?;
            if let Err(e) = std::fs::rename(&tmp, &target) {
                if let Some(b) = backup {
                    let _ = std::fs::rename(b, &target);
                }
                return Err(format!("cannot write {}: {e}", target.display()));
            }
            self.staged.remove(0);
            self.done.push((target, backup));
        }
        for name in stale {
            let path = dir.join(name);
            let removable = std::fs::symlink_metadata(&path)
                .is_ok_and(|m| m.file_type().is_file() || m.file_type().is_symlink());
            if removable {
                let backup = self.set_aside(&path)?;
                self.done.push((path, backup));
            }
        }
        // Last: a device cannot be put back.
        for (target, bytes) in in_place {
            std::fs::OpenOptions::new()
                .write(true)
                .open(&target)
                .and_then(|mut f| std::io::Write::write_all(&mut f, bytes.as_ref()))
                .map_err(|e| format!("cannot write {}: {e}", target.display()))?;
        }
        for (_, backup) in &self.done {
            if let Some(b) = backup {
                let _ = std::fs::remove_file(b);
            }
        }
        Ok(())
    }

    /// Renames what is at `path` (if anything) to a hidden backup beside it.
    fn set_aside(&self, path: &Path) -> Result<Option<PathBuf>, String> {
        if std::fs::symlink_metadata(path).is_err() {
            return Ok(None);
        }
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let backup = sibling(folder_of(path), &name, "orig");
        std::fs::rename(path, &backup)
            .map_err(|e| format!("cannot replace {}: {e}", path.display()))?;
        Ok(Some(backup))
    }

    /// Undo everything: staged files removed, replaced and removed files restored, new ones
    /// removed, created directories removed (only if empty: nothing else is touched).
    fn roll_back(&mut self) {
        for (tmp, _) in self.staged.drain(..) {
            let _ = std::fs::remove_file(tmp);
        }
        for (path, backup) in self.done.drain(..).rev() {
            if let Some(b) = backup {
                let _ = std::fs::rename(b, &path);
            } else {
                let _ = std::fs::remove_file(&path);
            }
        }
        for d in self.created.iter().rev() {
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// A file written all or nothing: created as a temporary beside its destination (the final
/// target of a symlink) when the run starts, so a bad path fails before any work; renamed
/// onto it by [`Self::commit`]; removed if dropped uncommitted. A device or FIFO is written
/// in place (see the module docs).
#[derive(Debug)]
pub struct OutputFile {
    /// The path as given, for errors.
    dest: PathBuf,
    /// Where the bytes land: `dest`, or its link's final target.
    target: PathBuf,
    /// The temporary beside `target`; `None` when writing into a special file in place.
    tmp: Option<PathBuf>,
    file: Option<std::fs::File>,
}

impl OutputFile {
    /// Checks `dest` (named by `flag`) can be written, by creating its temporary
    /// `.NAME.PID.partial`: its folder exists, it is not a folder, nor any of `inputs`.
    pub fn create(flag: &str, dest: &Path, inputs: &[Input]) -> Result<Self, String> {
        let bad = |why: String| format!("{flag} {}: {why}", dest.display());
        let target = final_target(dest).map_err(bad)?;
        let via = if target == dest {
            String::new()
        } else {
            format!(" (it links to {})", target.display())
        };
        if target.is_dir() {
            return Err(bad(format!("is a directory{via}")));
        }
        refuse_inputs(flag, dest, inputs)?;
        let (tmp, file) = if is_special(&target) {
            let file = std::fs::OpenOptions::new()
                .write(true)
                .open(&target)
                .map_err(|e| bad(format!("cannot write here: {e}")))?;
            (None, file)
        } else {
            let name = target
                .file_name()
                .ok_or_else(|| bad(format!("not a file name{via}")))?
                .to_string_lossy()
                .into_owned();
            let folder = folder_of(&target);
            if existing_ancestor(folder).map_err(|e| bad(format!("{e}{via}")))? != folder {
                return Err(bad(format!("the folder {} does not exist{via}", folder.display())));
            }
            let tmp = sibling(folder, &name, "partial");
            let file = std::fs::File::create(&tmp)
                .map_err(|e| bad(format!("cannot write in {}: {e}", folder.display())))?;
            (Some(tmp), file)
        };
        Ok(Self { dest: dest.to_path_buf(), target, tmp, file: Some(file) })
    }

    /// Writes `bytes` and renames the file into place.
    pub fn commit(mut self, bytes: &[u8]) -> Result<(), String> {
        use std::io::Write;
        let mut file = self.file.take().expect("committed once");
        let written = match &self.tmp {
            Some(tmp) => file
                .write_all(bytes)
                .and_then(|()| file.sync_all())
                .and_then(|()| std::fs::rename(tmp, &self.target)),
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

    fn read(path: &Path) -> String {
        std::fs::read_to_string(path).unwrap()
    }

    fn is_link(path: &Path) -> bool {
        std::fs::symlink_metadata(path).unwrap().file_type().is_symlink()
    }

    fn write_into(dir: &Path, file_set: &[&str], files: &[(&str, &str)]) -> Result<(), String> {
        OutputFolder::check("--out", dir, file_set, &[])?.write(files)
    }

    #[test]
    fn a_special_file_is_written_in_place_not_replaced() {
        let dev_null = Path::new("/dev/null");
        let before = std::fs::metadata(dev_null).expect("/dev/null").file_type();
        OutputFile::create("--logits-out", dev_null, &[])
            .expect("opens")
            .commit(b"logits")
            .expect("writes");
        let after = std::fs::metadata(dev_null).expect("/dev/null").file_type();
        assert!(!after.is_file(), "/dev/null was replaced by a regular file");
        assert_eq!(before.is_file(), after.is_file());
    }

    #[test]
    fn writes_every_file_creates_the_directory_and_removes_stale_ones() {
        let scratch = scratch("ok");
        let d = scratch.join("a/b");
        write_into(&d, &["x.txt", "y.txt"], &[("x.txt", "one"), ("y.txt", "two")]).unwrap();
        assert_eq!(listing(&d), ["x.txt", "y.txt"]);
        assert_eq!(read(&d.join("y.txt")), "two");
        // A run that writes only `x.txt` of the set removes the earlier `y.txt`, leaves
        // other files alone and leaves no backups behind.
        std::fs::write(d.join("mine.txt"), "keep").unwrap();
        write_into(&d, &["x.txt", "y.txt"], &[("x.txt", "three")]).unwrap();
        assert_eq!(listing(&d), ["mine.txt", "x.txt"]);
        assert_eq!(read(&d.join("x.txt")), "three");
    }

    #[test]
    fn a_directory_in_the_way_is_refused_before_anything_is_written() {
        let d = scratch("dir_in_the_way");
        std::fs::create_dir_all(d.join("b.txt/keep")).unwrap();
        let check = |dir: &Path, names: &[&str]| OutputFolder::check("--out", dir, names, &[]);
        let err = check(&d, &["a.txt", "b.txt"]).unwrap_err();
        assert!(err.contains("b.txt is a folder"), "{err}");
        assert!(write_into(&d, &["a.txt", "b.txt"], &[("a.txt", "1"), ("b.txt", "2")]).is_err());
        assert_eq!(listing(&d), ["b.txt"]);
        let file = d.join("b.txt/keep/f");
        std::fs::write(&file, "").unwrap();
        let err = check(&file.join("sub"), &["a.txt"]).unwrap_err();
        assert!(err.contains(&format!("{} is not a folder", file.display())), "{err}");
        assert!(check(&d, &["../x"]).unwrap_err().contains("not a plain file name"));
        assert!(check(&d, &["a", "a"]).unwrap_err().contains("named twice"));
    }

    #[test]
    fn a_failure_while_renaming_restores_every_replaced_and_removed_file() {
        let d = scratch("rollback");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("a.txt"), "old a").unwrap();
        std::fs::write(d.join("c.txt"), "old c").unwrap();
        // Passes the up-front check, then a directory appears where `b.txt` goes (a race
        // with another process): `a.txt` was already replaced and must come back.
        let created = missing_dirs(&d);
        let mut txn = Transaction { staged: Vec::new(), done: Vec::new(), created };
        std::fs::create_dir(d.join("b.txt")).unwrap();
        let err = txn.run(&d, &[("a.txt", "new a"), ("b.txt", "new b")], &["c.txt"]).unwrap_err();
        txn.roll_back();
        assert!(err.contains("b.txt is a folder"), "{err}");
        assert_eq!(listing(&d), ["a.txt", "b.txt", "c.txt"]);
        assert_eq!(read(&d.join("a.txt")), "old a");
        // A failure after the stale file was set aside (writing the device /dev/full, done
        // last) puts back the replaced file and the removed one.
        std::fs::remove_dir(d.join("b.txt")).unwrap();
        std::os::unix::fs::symlink("/dev/full", d.join("full.bin")).unwrap();
        let mut txn = Transaction { staged: Vec::new(), done: Vec::new(), created: Vec::new() };
        let err = txn.run(&d, &[("a.txt", "new a"), ("full.bin", "x")], &["c.txt"]).unwrap_err();
        txn.roll_back();
        assert!(err.contains("/dev/full"), "{err}");
        assert_eq!(listing(&d), ["a.txt", "c.txt", "full.bin"]);
        assert_eq!(read(&d.join("a.txt")), "old a");
        assert_eq!(read(&d.join("c.txt")), "old c");
    }

    #[test]
    fn directories_created_for_a_failed_write_are_removed() {
        let base = scratch("created");
        std::fs::create_dir_all(&base).unwrap();
        let d = base.join("new/deeper");
        let created = missing_dirs(&d);
        std::fs::create_dir_all(&d).unwrap();
        let mut txn = Transaction { staged: Vec::new(), done: Vec::new(), created };
        std::fs::create_dir(d.join("b.txt")).unwrap();
        assert!(txn.run(&d, &[("a.txt", "1"), ("b.txt", "2")], &[]).is_err());
        std::fs::remove_dir(d.join("b.txt")).unwrap();
        txn.roll_back();
        assert!(listing(&base).is_empty(), "{:?}", listing(&base));
    }

    /// The same file as an input, by its own path, through a symlink or as a hard link, is
    /// refused naming both, before anything is created; another file is not.
    #[test]
    fn an_output_that_is_an_input_is_refused() {
        let d = scratch("inputs");
        std::fs::create_dir_all(&d).unwrap();
        let checkpoint = d.join("model.safetensors");
        std::fs::write(&checkpoint, "weights").unwrap();
        std::os::unix::fs::symlink(&checkpoint, d.join("link.json")).unwrap();
        std::fs::hard_link(&checkpoint, d.join("hard.json")).unwrap();
        std::fs::write(d.join("other.json"), "").unwrap();
        let inputs = [Input::new("the checkpoint file", &checkpoint)];
        for name in ["model.safetensors", "link.json", "hard.json"] {
            let err = OutputFile::create("--logits-out", &d.join(name), &inputs).unwrap_err();
            assert!(
                err.contains(&format!("--logits-out: {}", d.join(name).display()))
                    && err.contains(&format!("is the checkpoint file {}", checkpoint.display()))
                    && err.contains("an output never replaces an input"),
                "{err}"
            );
            let err = OutputFolder::check("--out", &d, &["x.mlir", name], &inputs).unwrap_err();
            assert!(err.contains("is the checkpoint file"), "{err}");
        }
        assert!(OutputFile::create("--logits-out", &d.join("other.json"), &inputs).is_ok());
        assert_eq!(read(&checkpoint), "weights");
        assert_eq!(listing(&d), ["hard.json", "link.json", "model.safetensors", "other.json"]);
    }

    /// A symlinked output is written through (to an existing target, a dangling one, a chain
    /// of relative links): the link stays a link, the target gets the bytes, all at once.
    #[test]
    fn a_symlinked_output_is_written_through() {
        let d = scratch("links");
        let (here, there) = (d.join("here"), d.join("there"));
        std::fs::create_dir_all(&here).unwrap();
        std::fs::create_dir_all(&there).unwrap();
        std::fs::write(there.join("old.json"), "old").unwrap();
        std::os::unix::fs::symlink(there.join("old.json"), here.join("link.json")).unwrap();
        std::os::unix::fs::symlink("../there/new.json", here.join("dangling.json")).unwrap();
        std::os::unix::fs::symlink("dangling.json", here.join("chain.json")).unwrap();
        for (link, target, bytes) in [
            ("link.json", "old.json", "one"),
            ("chain.json", "new.json", "two"),
            ("dangling.json", "new.json", "three"),
        ] {
            let out = OutputFile::create("--logits-out", &here.join(link), &[]).unwrap();
            out.commit(bytes.as_bytes()).unwrap();
            assert!(is_link(&here.join(link)), "{link} stays a link");
            assert_eq!(read(&there.join(target)), bytes);
        }
        assert_eq!(listing(&here), ["chain.json", "dangling.json", "link.json"]);
        assert_eq!(listing(&there), ["new.json", "old.json"], "no temporary left");
        // The same through an output folder; the stale link is removed, not its target.
        std::os::unix::fs::symlink(there.join("stale.bin"), here.join("x.bin")).unwrap();
        std::fs::write(there.join("stale.bin"), "stale").unwrap();
        write_into(&here, &["link.json", "x.bin"], &[("link.json", "four")]).unwrap();
        assert!(is_link(&here.join("link.json")));
        assert_eq!(read(&there.join("old.json")), "four");
        assert_eq!(listing(&here), ["chain.json", "dangling.json", "link.json"]);
        assert_eq!(listing(&there), ["new.json", "old.json", "stale.bin"]);
        // A link whose target folder is missing is refused up front.
        std::os::unix::fs::symlink(d.join("nowhere/x"), here.join("lost.json")).unwrap();
        let err = OutputFile::create("--logits-out", &here.join("lost.json"), &[]).unwrap_err();
        assert!(err.contains("does not exist (it links to"), "{err}");
        let err = OutputFolder::check("--out", &here, &["lost.json"], &[]).unwrap_err();
        assert!(err.contains("whose folder does not exist"), "{err}");
    }

    #[test]
    fn a_file_in_place_of_the_folder_is_named() {
        let d = scratch("afile");
        std::fs::create_dir_all(&d).unwrap();
        let afile = d.join("afile");
        std::fs::write(&afile, "").unwrap();
        for dest in [afile.join("x.json"), afile.join("sub/x.json")] {
            let err = OutputFile::create("--logits-out", &dest, &[]).unwrap_err();
            assert_eq!(
                err,
                format!("--logits-out {}: {} is not a folder", dest.display(), afile.display())
            );
        }
        let err = OutputFile::create("--logits-out", &d.join("no/x.json"), &[]).unwrap_err();
        assert!(err.ends_with(&format!("the folder {} does not exist", d.join("no").display())));
    }

    /// A folder that takes no new files is refused by the check, whoever runs it (root
    /// ignores permission bits: /proc refuses new files even to root).
    #[test]
    fn a_folder_that_takes_no_files_is_refused_by_the_check() {
        let err = OutputFolder::check("--out", Path::new("/proc/palladium-out"), &["a"], &[])
            .unwrap_err();
        assert!(
            err.starts_with(
                "cannot write into --out /proc/palladium-out: /proc does not take new files"
            ),
            "{err}"
        );
    }
}
