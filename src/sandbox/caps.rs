//! The capability bounding set, emptied by each confined call or once by the spawner that forks
//! them all ([`super::spawner`]).

/// Empties the bounding set of this thread — what an exec can ever give it, and every process
/// it forks from then on — so that not even a root command regains a capability; when it may
/// (`CAP_SETPCAP`: else there is nothing to drop). Its capability sets stay as they are.
pub(super) fn empty_bounding_set() -> Result<(), String> {
    use rustix::thread::CapabilitySet;
    let held = rustix::thread::capabilities(None).map_err(|e| format!("capget: {e}"))?;
    if !held.effective.contains(CapabilitySet::SETPCAP) {
        return Ok(());
    }
    for cap in CapabilitySet::all().iter() {
        match rustix::thread::remove_capability_from_bounding_set(cap) {
            // EINVAL: a capability this kernel does not know.
            Ok(()) | Err(rustix::io::Errno::INVAL) => {}
            Err(e) => return Err(format!("cannot drop capabilities: {e}")),
        }
    }
    Ok(())
}
