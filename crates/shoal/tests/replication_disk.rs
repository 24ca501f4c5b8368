//! A replica's disk fills up under load, with real `shoal` processes on 127.0.0.1: each broker
//! of the group ([`support::replicas`]) has a disk of its own, a 256 MiB tmpfs on its data
//! directory in a mount namespace of its own (`unshare -m`, which needs root; without it the
//! test is skipped, and fails under `SHOAL_REQUIRE_EXTERNAL=1` as CI runs it). The test fills
//! one replica's disk with a file until the disk refuses more, frees it later, and checks what
//! users see: sends go on, the replica leaves the in-sync set and comes back, and no
//! acknowledged message is lost, even when the replica is afterwards the only broker left.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed unwrap is a failed test"
)]

mod support;

use std::collections::BTreeSet;
use std::io::Write;
use std::path::Path;
use std::time::Instant;
use support::replicas::{
    acknowledged, check_history, in_sync_len, longest_gap, under_load, wait_all_consumed,
    wait_sends, Loaded, Replicas,
};

/// Each broker's disk.
const DISK_BYTES: u64 = 256 << 20;

/// Writes `path` until the disk refuses more; returns the bytes written.
fn fill(path: &Path) -> u64 {
    let mut f = std::fs::File::create(path).unwrap();
    let chunk = vec![0x5a_u8; 1 << 20];
    let mut written = 0;
    loop {
        match f.write(&chunk) {
            Ok(0) => break,
            Ok(n) => written += n as u64,
            Err(e) => {
                assert_eq!(
                    e.kind(),
                    std::io::ErrorKind::StorageFull,
                    "filling the disk: {e}"
                );
                break;
            }
        }
    }
    // What fits of a smaller write, so that not even a page is left.
    for size in [64 << 10, 4 << 10, 512, 1] {
        while f.write(&chunk[..size]).is_ok_and(|n| n > 0) {
            written += size as u64;
        }
    }
    written
}

fn in_sync_has(g: &serde_json::Value, id: u64) -> bool {
    g["inSync"]
        .as_array()
        .unwrap()
        .iter()
        .any(|v| v.as_u64() == Some(id))
}

/// A replica's disk fills under load: it cannot append what the master ships, the master
/// drops it from the in-sync set and sends go on. Once its disk has room again it catches up
/// and rejoins. Then the master and the other replica are SIGKILLed: it is elected and alone
/// serves every acknowledged message.
#[test]
fn a_replica_whose_disk_fills_leaves_the_in_sync_set_and_rejoins_when_it_has_room() {
    let Some(mut r) = Replicas::start_on_small_disks(DISK_BYTES) else {
        support::external::skip(
            "a disk of its own per broker needs `unshare -m` and tmpfs mounts (root)",
        );
        return;
    };
    let Loaded {
        epoch,
        master,
        replica,
        other,
        mut producer,
        mut group,
    } = under_load(&r, "d", "disk-readers");
    wait_sends(&producer, 100, "the master acknowledged too little");
    let replica_id = r.id_of(&r.wait_group("no group", |g| g["master"].is_u64()), replica);

    let filler = r.in_data_dir(replica, "filler");
    let at = Instant::now();
    let filled = fill(&filler);
    r.wait_group(
        "the replica with a full disk stayed in the in-sync set",
        |g| in_sync_len(g) == 2 && !in_sync_has(g, replica_id),
    );
    let left_after = at.elapsed();
    wait_sends(&producer, 200, "sends did not go on beside the full disk");
    let gap = longest_gap(&producer, at);

    std::fs::remove_file(&filler).unwrap();
    let freed = Instant::now();
    r.wait_group(
        "the replica did not rejoin the in-sync set once its disk had room",
        |g| in_sync_len(g) == 3,
    );
    let rejoined_after = freed.elapsed();
    wait_sends(&producer, 100, "sends stopped after the replica rejoined");
    let before_kill = acknowledged(&producer).len();

    r.kill_broker(master);
    r.kill_broker(other);
    let g = r.wait_group("the replica that rejoined was not elected", |g| {
        g["masterEpoch"].as_u64().unwrap_or(0) > epoch && g["master"].is_u64()
    });
    assert_eq!(r.index_of(&g, g["master"].as_u64().unwrap()), replica);
    let acked: BTreeSet<String> = producer.stop().into_iter().collect();
    let failed = producer.failed.lock().unwrap().len();
    wait_all_consumed(&group, &acked);
    check_history(&producer, &group);
    eprintln!(
        "replica's disk filled ({} MiB written to fill it): out of the in-sync set after {left_after:?}, \
         longest gap between acknowledgements {gap:?}, back in it {rejoined_after:?} after the disk had room; \
         {before_kill} acknowledged before the master and the other replica were killed, {} in all, \
         all consumed from the replica alone; {failed} sends failed",
        filled >> 20,
        acked.len()
    );
    for m in group.group.members.values_mut() {
        m.sigkill();
    }
}
