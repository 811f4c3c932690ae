//! The seed's `> /dev/` entry, read as "a redirection to a device node": which redirections
//! `bash` refuses, and the harmless devices (`/dev/null`, `/dev/stdout`, `/dev/stderr`) it lets
//! through. bash's own network pseudo-paths (`/dev/tcp/HOST/PORT`, `/dev/udp/…`) are no device
//! nodes and pass too: whether a command may reach the network is the sandbox's decision (no
//! network by default), not a substring's. A convenience for parity with the seed, not a
//! security boundary.

/// Devices a command may redirect output to: they discard it or pass it on, and models write
/// `> /dev/null` constantly.
pub const HARMLESS_DEVICES: [&str; 3] = ["null", "stdout", "stderr"];

/// True when `command` redirects output to a device other than the [`HARMLESS_DEVICES`].
pub(super) fn redirects_to_device(command: &str) -> bool {
    command.match_indices('>').any(|(at, _)| {
        // `>`, `>>`, `>|`, `>&`; then blanks; then at most one opening quote.
        let target = command[at + 1..]
            .trim_start_matches(['>', '|', '&'])
            .trim_start_matches([' ', '\t']);
        let target = target.strip_prefix(['"', '\'']).unwrap_or(target);
        let Some(device) = target.strip_prefix("/dev/") else {
            return false;
        };
        if device.starts_with("tcp/") || device.starts_with("udp/") {
            return false;
        }
        let name = device
            .split(|c: char| c.is_whitespace() || ";|&)<>'\"`".contains(c))
            .next()
            .unwrap_or_default();
        !HARMLESS_DEVICES.contains(&name)
    })
}

#[cfg(test)]
mod tests {
    use super::redirects_to_device;

    #[test]
    fn harmless_devices_pass_and_other_devices_do_not() {
        for harmless in [
            "ls > /dev/null",
            "ls >/dev/null 2>&1",
            "ls 2>/dev/null",
            "ls &>/dev/null",
            "ls >> /dev/null",
            "echo hi > /dev/stderr; echo ok >/dev/stdout",
            "cat x 2> \"/dev/null\"",
            "ls >| /dev/null",
            "echo '>' /dev/sda",
            "echo > /dev/tcp/127.0.0.1/8080",
        ] {
            assert!(!redirects_to_device(harmless), "{harmless}");
        }
        for device in [
            "echo x > /dev/sda",
            "echo x >/dev/sda1",
            "ls > /dev/null; echo x >> /dev/tty",
            "echo x > /dev/null2",
            "echo x 2>/dev/mem",
            "echo x > /dev/",
        ] {
            assert!(redirects_to_device(device), "{device}");
        }
    }
}
