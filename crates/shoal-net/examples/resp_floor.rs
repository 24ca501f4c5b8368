//! The floor of a tokio server on this machine, for `benches/peers/vs_redis.py --floor`.
//!
//! A server of Redis's wire protocol (RESP) that does no work: it answers every command with a
//! new stream ID, as XADD does, without storing anything. The socket reads and writes, the
//! wake-ups and tokio's scheduling are all it costs, so its CPU per command under
//! `redis-benchmark` is what any tokio server pays per request before doing anything; Shoal's
//! broker and Redis are compared against it.
//!
//! ```text
//! cargo run --release -p shoal-net --example resp_floor -- 127.0.0.1:26095 [WORKERS]
//! ```
//!
//! WORKERS: tokio worker threads (default: one per CPU, as `shoal dev`); 0 runs a
//! current-thread runtime.

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A connection that sends more than this without a complete command is closed.
const MAX_PENDING: usize = 1 << 20;

/// The length of the first complete command in `buf` (an array of bulk strings), `Ok(None)` if
/// it is incomplete, `Err` if it is not RESP.
fn command_len(buf: &[u8]) -> Result<Option<usize>, &'static str> {
    // One `<prefix><integer>\r\n` line at `at`: the integer and where the next line starts.
    fn line(buf: &[u8], at: usize, prefix: u8) -> Result<Option<(usize, usize)>, &'static str> {
        let Some(&first) = buf.get(at) else {
            return Ok(None);
        };
        if first != prefix {
            return Err("expected an array of bulk strings");
        }
        let Some(end) = buf[at..].windows(2).position(|w| w == b"\r\n") else {
            return Ok(None);
        };
        let digits = std::str::from_utf8(&buf[at + 1..at + end]).map_err(|_| "bad length")?;
        let n: usize = digits.parse().map_err(|_| "bad length")?;
        Ok(Some((n, at + end + 2)))
    }
    let Some((args, mut at)) = line(buf, 0, b'*')? else {
        return Ok(None);
    };
    for _ in 0..args {
        let Some((len, start)) = line(buf, at, b'$')? else {
            return Ok(None);
        };
        at = start + len + 2;
        if at > buf.len() {
            return Ok(None);
        }
    }
    Ok(Some(at))
}

async fn serve(mut socket: tokio::net::TcpStream) {
    let _ = socket.set_nodelay(true);
    let mut pending: Vec<u8> = Vec::with_capacity(64 * 1024);
    let mut answers: Vec<u8> = Vec::with_capacity(64 * 1024);
    let mut read = vec![0u8; 64 * 1024];
    let mut seq: u64 = 0;
    loop {
        let n = match socket.read(&mut read).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        pending.extend_from_slice(&read[..n]);
        let mut used = 0;
        loop {
            match command_len(&pending[used..]) {
                Ok(Some(len)) => {
                    used += len;
                    seq += 1;
                    let id = format!("1700000000000-{seq}");
                    answers.extend_from_slice(format!("${}\r\n{id}\r\n", id.len()).as_bytes());
                }
                Ok(None) => break,
                Err(e) => {
                    let _ = socket.write_all(format!("-ERR {e}\r\n").as_bytes()).await;
                    return;
                }
            }
        }
        pending.drain(..used);
        if pending.len() > MAX_PENDING {
            return;
        }
        if !answers.is_empty() {
            if socket.write_all(&answers).await.is_err() {
                return;
            }
            answers.clear();
        }
    }
}

fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let addr = args.next().unwrap_or_else(|| "127.0.0.1:26095".into());
    let workers: Option<usize> = args.next().and_then(|w| w.parse().ok());
    let runtime = match workers {
        Some(0) => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?,
        Some(n) => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(n)
            .enable_all()
            .build()?,
        None => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?,
    };
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(&addr).await?;
        println!("resp_floor listening on {}", listener.local_addr()?);
        loop {
            let (socket, _) = listener.accept().await?;
            tokio::spawn(serve(socket));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::command_len;

    #[test]
    fn finds_whole_commands_only() {
        let cmd = b"*3\r\n$4\r\nXADD\r\n$1\r\n*\r\n$2\r\nab\r\n";
        assert_eq!(command_len(cmd), Ok(Some(cmd.len())));
        for cut in 0..cmd.len() {
            assert_eq!(command_len(&cmd[..cut]), Ok(None), "cut at {cut}");
        }
        let mut two = cmd.to_vec();
        two.extend_from_slice(cmd);
        assert_eq!(command_len(&two), Ok(Some(cmd.len())));
        assert!(command_len(b"PING\r\n").is_err());
        assert!(command_len(b"*1\r\n$x\r\n").is_err());
    }
}
