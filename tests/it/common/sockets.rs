//! This process's sockets as Linux shows them: a listener is known by its inode, which no other
//! socket takes while it lives, so a test can tell "our listener is closed" apart from "somebody
//! else now listens on that port".

use std::net::SocketAddr;

/// The inode of the IPv4 socket listening on `addr` (`/proc/net/tcp`, where state 0A is LISTEN).
pub fn listening_socket(addr: SocketAddr) -> Option<u64> {
    let SocketAddr::V4(v4) = addr else {
        return None;
    };
    // The kernel prints the address as the u32 it stores (network order, read on a little-endian host).
    let local = format!("{:08X}:{:04X}", u32::from_le_bytes(v4.ip().octets()), v4.port());
    let table = std::fs::read_to_string("/proc/net/tcp").expect("/proc/net/tcp");
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let listening = fields.get(1) == Some(&local.as_str()) && fields.get(3) == Some(&"0A");
        listening.then(|| fields.get(9)?.parse().ok())?
    })
}

/// Whether this process still has a descriptor on the socket with inode `inode`.
pub fn holds_socket(inode: u64) -> bool {
    let wanted = format!("socket:[{inode}]");
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
        .any(|target| target.as_os_str() == wanted.as_str())
}
