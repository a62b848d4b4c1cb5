//! The generator's own CPU time: per-thread ticks from `/proc/self/task` (Linux).

/// The unit of the CPU times in `/proc/<pid>/task/<tid>/stat` (Linux's `USER_HZ`).
pub(crate) const PROC_TICKS_PER_SECOND: f64 = 100.0;

/// CPU time (user + system, in `USER_HZ` ticks) of each of this process's threads, by thread
/// id; `None` where `/proc/self/task` cannot be read.
pub(crate) fn thread_cpu_ticks() -> Option<std::collections::HashMap<u32, u64>> {
    let mut out = std::collections::HashMap::new();
    for entry in std::fs::read_dir("/proc/self/task").ok()? {
        let Ok(entry) = entry else { continue };
        let Some(tid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        // A thread may exit between listing and reading: skip it.
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
        // Fields after the command name (which may hold spaces) start with the state (field 3);
        // utime and stime are fields 14 and 15.
        let Some((_, rest)) = stat.rsplit_once(')') else { continue };
        let fields: Vec<&str> = rest.split_ascii_whitespace().collect();
        let (Some(utime), Some(stime)) =
            (fields.get(11).and_then(|v| v.parse::<u64>().ok()), fields.get(12).and_then(|v| v.parse::<u64>().ok()))
        else {
            continue;
        };
        out.insert(tid, utime + stime);
    }
    Some(out)
}

/// This thread's id, where `/proc/thread-self` tells it.
pub(crate) fn current_tid() -> Option<u32> {
    let link = std::fs::read_link("/proc/thread-self").ok()?;
    link.file_name()?.to_str()?.parse().ok()
}
