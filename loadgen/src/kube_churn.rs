//! A `loadgen churn` child against the API server a kubeconfig names, as `e2e --kubeconfig`
//! and `soak --kubeconfig` drive it (docs/real-clusters.md): the kubeconfig's URL, the churn's
//! command line, its record (when each write returned, the resource version it got) read back
//! whole or as it grows, and the cleanup of a run's pods.
//!
//! Both commands measure lag from a write's return in the churn to their own handler, matched
//! by resource version; this module is what they share, a layer below them (a command never
//! imports another).

use std::collections::{BTreeMap, HashMap};
use std::io::{Read as _, Seek as _, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};

use kube::config::{KubeConfigOptions, Kubeconfig};

/// The kubeconfig at `path` read and resolved (its current context), plain HTTP only.
pub async fn kube_config(path: &Path) -> Result<kube::Config, String> {
    let kubeconfig = Kubeconfig::read_from(path)
        .map_err(|e| format!("reading the kubeconfig {}: {e}", path.display()))?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| format!("using the kubeconfig {}: {e}", path.display()))?;
    if config.cluster_url.scheme_str() != Some("http") {
        return Err(format!(
            "the kubeconfig's server is {}; this loadgen speaks plain HTTP only: run `kubectl proxy --port 8001` and point a kubeconfig at http://127.0.0.1:8001 (docs/real-clusters.md)",
            config.cluster_url
        ));
    }
    Ok(config)
}

/// The cluster URL the kubeconfig at `path` names (its current context), plain HTTP only.
pub async fn cluster_url(path: &Path) -> Result<String, String> {
    let config = kube_config(path).await?;
    Ok(config
        .cluster_url
        .to_string()
        .trim_end_matches('/')
        .to_owned())
}

/// What a churn runs against.
#[derive(Debug, Clone)]
pub struct Target<'a> {
    /// The kubeconfig file.
    pub kubeconfig: &'a Path,
    /// Its server, `http://…`.
    pub url: &'a str,
    /// The namespace the churn writes to.
    pub namespace: &'a str,
    /// `churn --allow-foreign`.
    pub allow_foreign: bool,
    /// The churn's workload arguments (`--workload`, `--keys`, `--events`, `--seed`, `--rate`).
    pub workload_args: Vec<String>,
}

/// `loadgen churn` with `args` against `target`, its stdin and stdout piped, its stderr the
/// caller's.
pub fn churn_command(exe: &Path, target: &Target<'_>, args: &[&str]) -> Command {
    let mut command = Command::new(exe);
    command
        .arg("churn")
        .arg("--kubeconfig")
        .arg(target.kubeconfig)
        .args(["--namespace", target.namespace])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    command
}

/// `churn --hold --run RUN --record RECORD` with the target's workload arguments (and
/// `--allow-foreign` when the target allows it), started.
pub fn spawn_held(
    exe: &Path,
    target: &Target<'_>,
    run: &str,
    record: &Path,
) -> Result<Child, String> {
    let mut args: Vec<&str> = target.workload_args.iter().map(String::as_str).collect();
    args.extend(["--run", run, "--hold"]);
    let record_arg = record.to_string_lossy().into_owned();
    args.extend(["--record", &record_arg]);
    if target.allow_foreign {
        args.push("--allow-foreign");
    }
    churn_command(exe, target, &args)
        .spawn()
        .map_err(|e| format!("cannot start {} churn: {e}", exe.display()))
}

/// Waits for `child` to exit, off the runtime's threads.
pub async fn wait(mut child: Child) -> Result<ExitStatus, String> {
    tokio::task::spawn_blocking(move || child.wait())
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("waiting for a child process: {e}"))
}

/// Kills `child` and reaps it.
pub async fn end(mut child: Child) {
    let _ = child.kill();
    let _ = wait(child).await;
}

/// Deletes the pods of `run` (`churn --cleanup`); a failure is reported with the run's id and
/// the command that removes its pods, not hidden.
pub async fn cleanup(exe: &Path, target: &Target<'_>, run: &str) -> Result<(), String> {
    let child = churn_command(exe, target, &["--cleanup", "--run", run])
        .stdin(Stdio::null())
        .spawn()
        .map_err(|e| {
            format!(
                "cannot start {} churn --cleanup: {e}; the pods of run {run} may still be there (`loadgen churn --cleanup --run {run}`)",
                exe.display()
            )
        })?;
    let status = wait(child).await?;
    if status.success() {
        Ok(())
    } else {
        Err(format!(
            "`loadgen churn --cleanup --run {run}` ended with {status} (its error is above); the pods of run {run} may still be there"
        ))
    }
}

/// One line of a churn's record: (resource version, when the write returned in Unix
/// nanoseconds), or `None` for a line without both (a delete the server answered without
/// the pod).
pub fn record_line(line: &str) -> Result<Option<(u64, u64)>, serde_json::Error> {
    let value: serde_json::Value = serde_json::from_str(line)?;
    let rv = value["resource_version"]
        .as_str()
        .and_then(|rv| rv.parse::<u64>().ok());
    let at = value["returned_unix_ns"].as_u64();
    Ok(rv.zip(at))
}

/// The churn's record: resource version → when its write returned (Unix nanoseconds).
pub fn read_record(path: &Path) -> Result<HashMap<u64, u64>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("reading the churn's record {}: {e}", path.display()))?;
    let mut returned = HashMap::new();
    for (i, line) in text.lines().enumerate() {
        let parsed = record_line(line).map_err(|e| format!("{}:{}: {e}", path.display(), i + 1))?;
        if let Some((rv, at)) = parsed {
            returned.insert(rv, at);
        }
    }
    Ok(returned)
}

/// What a churn's record says it left: pod name → its last write's resource version, `None`
/// after a delete (each key's writes are in order in the record, so its last line is its last
/// write).
pub fn final_versions(path: &Path) -> Result<BTreeMap<String, Option<u64>>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("reading the churn's record {}: {e}", path.display()))?;
    let mut last = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        let value: serde_json::Value =
            serde_json::from_str(line).map_err(|e| format!("{}:{}: {e}", path.display(), i + 1))?;
        let Some(name) = value["name"].as_str() else {
            return Err(format!("{}:{}: no pod name", path.display(), i + 1));
        };
        let rv = match value["op"].as_str() {
            Some("delete") => None,
            _ => value["resource_version"]
                .as_str()
                .and_then(|rv| rv.parse::<u64>().ok()),
        };
        last.insert(name.to_owned(), rv);
    }
    Ok(last)
}

/// The lines of `child`'s stdout, as they come; the channel closes at its end.
pub fn lines(child: &mut Child) -> tokio::sync::mpsc::UnboundedReceiver<String> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    if let Some(stdout) = child.stdout.take() {
        std::thread::spawn(move || {
            for line in std::io::BufRead::lines(std::io::BufReader::new(stdout)) {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
    }
    rx
}

/// A churn's record read as the churn writes it: each call hands back the lines completed
/// since the last (the churn writes through a buffer, so the last line may be half there).
#[derive(Debug)]
pub struct RecordTail {
    path: PathBuf,
    offset: u64,
    partial: Vec<u8>,
    lines: usize,
}

impl RecordTail {
    /// A reader of the record at `path`, from its start (the file may not exist yet).
    pub fn new(path: PathBuf) -> Self {
        Self {
            path,
            offset: 0,
            partial: Vec::new(),
            lines: 0,
        }
    }

    /// The (resource version, returned at) pairs of the lines completed since the last call.
    pub fn read_new(&mut self) -> Result<Vec<(u64, u64)>, String> {
        let mut file = match std::fs::File::open(&self.path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(format!("reading {}: {e}", self.path.display())),
        };
        let mut bytes = Vec::new();
        file.seek(SeekFrom::Start(self.offset))
            .and_then(|_| file.read_to_end(&mut bytes))
            .map_err(|e| format!("reading {}: {e}", self.path.display()))?;
        self.offset += bytes.len() as u64;
        self.partial.extend_from_slice(&bytes);
        let Some(end) = self.partial.iter().rposition(|&b| b == b'\n') else {
            return Ok(Vec::new());
        };
        let complete: Vec<u8> = self.partial.drain(..=end).collect();
        let mut pairs = Vec::new();
        for line in String::from_utf8_lossy(&complete).lines() {
            self.lines += 1;
            let parsed = record_line(line)
                .map_err(|e| format!("{}:{}: {e}", self.path.display(), self.lines))?;
            pairs.extend(parsed);
        }
        Ok(pairs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;

    #[test]
    fn the_tail_hands_back_complete_lines_once() {
        let path = std::env::temp_dir().join(format!("kube-churn-tail-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let mut tail = RecordTail::new(path.clone());
        assert_eq!(tail.read_new().unwrap(), []);
        let mut file = std::fs::File::create(&path).unwrap();
        let mut append = |text: &str| {
            file.write_all(text.as_bytes()).unwrap();
            file.flush().unwrap();
        };
        append(r#"{"resource_version":"7","returned_unix_ns":70}"#);
        append("\n");
        append(r#"{"resource_version":"8","#);
        assert_eq!(tail.read_new().unwrap(), [(7, 70)]);
        assert_eq!(tail.read_new().unwrap(), []);
        append(r#""returned_unix_ns":80}"#);
        append("\n");
        append(r#"{"resource_version":null,"returned_unix_ns":90}"#);
        append("\n");
        assert_eq!(tail.read_new().unwrap(), [(8, 80)]);
        append("not json\n");
        assert!(tail.read_new().unwrap_err().contains(":4:"));
        let _ = std::fs::remove_file(&path);
    }
}
