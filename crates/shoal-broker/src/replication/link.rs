//! One ordered link to another broker of the group: a task that sends the queued replication
//! messages (oneway) on one connection at a time and tells the replication task, as
//! [`Input::Unreachable`], whenever the broker cannot be reached: a message could not be sent
//! (the connection was refused or failed), or the open connection closed.
//!
//! The second matters when nothing is being sent: a replica SIGKILLed while the last batch to
//! it is in flight closes its connection at once, but the master ships nothing more to it
//! while the write that batch carries waits for it (a producer that waits for each answer
//! sends nothing else), so no send would fail before the next heartbeat (`heartbeat_ms`
//! later). Reported when it closes, the master proposes the replica out of the in-sync set at
//! once. Either way it is a hint for the member, never evidence: anything that comes from the
//! broker clears it.

use super::Input;
use shoal_ha::BrokerId;
use shoal_net::connection::Connection;
use shoal_net::RemotingClient;
use shoal_proto::RemotingCommand;
use tokio::sync::mpsc;

/// Sends what comes on `queue` to `target` (broker `to`) until the queue closes.
pub(super) async fn run(
    client: RemotingClient,
    target: String,
    to: BrokerId,
    mut queue: mpsc::Receiver<RemotingCommand>,
    inbox: mpsc::Sender<Input>,
) {
    // A full inbox drops the hint (the lag rule remains, and the next failed send tells again).
    let unreachable = || {
        let _ = inbox.try_send(Input::Unreachable(to));
    };
    let mut conn: Option<Connection> = None;
    loop {
        let watched = conn.clone();
        let closed = async move {
            match watched {
                Some(c) => c.closed().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            cmd = queue.recv() => {
                let Some(cmd) = cmd else { return };
                let sent = match client.connection(&target).await {
                    Ok(c) => {
                        let sent = c.oneway(cmd).await;
                        conn = Some(c);
                        sent
                    }
                    Err(e) => Err(e),
                };
                if let Err(e) = sent {
                    tracing::debug!(peer = %target, error = %e, "replication message not sent");
                    conn = None;
                    unreachable();
                }
            }
            () = closed => {
                tracing::debug!(peer = %target, "replication link closed");
                conn = None;
                unreachable();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]
    use super::*;
    use shoal_net::{NetConfig, NotSupportedProcessor};
    use std::sync::Arc;
    use std::time::Duration;
    use tokio::io::AsyncReadExt;

    /// Waits for the next input (a hang is a failure, not a stuck run).
    async fn next(rx: &mut mpsc::Receiver<Input>) -> Option<Input> {
        tokio::time::timeout(Duration::from_secs(30), rx.recv())
            .await
            .expect("no input came")
    }

    #[tokio::test]
    async fn a_peer_that_closes_its_connection_is_reported_with_nothing_more_sent() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let target = listener.local_addr().unwrap().to_string();
        let client = RemotingClient::new(NetConfig::default(), Arc::new(NotSupportedProcessor));
        let (queue, rx) = mpsc::channel(8);
        let (inbox, mut inputs) = mpsc::channel(8);
        tokio::spawn(run(client, target, 2, rx, inbox));
        queue.send(RemotingCommand::request(9082)).await.unwrap();
        // The peer reads the message, then dies (its socket closes) without answering.
        let (mut sock, _) = listener.accept().await.unwrap();
        let mut buf = [0u8; 64];
        assert!(sock.read(&mut buf).await.unwrap() > 0);
        drop(sock);
        drop(listener);
        // Reported although nothing else was queued.
        assert!(matches!(
            next(&mut inputs).await,
            Some(Input::Unreachable(2))
        ));
        // The next message finds nobody listening: reported again.
        queue.send(RemotingCommand::request(9082)).await.unwrap();
        assert!(matches!(
            next(&mut inputs).await,
            Some(Input::Unreachable(2))
        ));
        // Nothing else: one report per event.
        drop(queue);
        assert!(next(&mut inputs).await.is_none());
    }
}
