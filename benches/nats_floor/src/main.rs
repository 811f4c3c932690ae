//! `nats-floor URL_A URL_B [ROUND_TRIPS]`: the floor under a relayed turn and a failover, on the
//! NATS servers at `URL_A` and `URL_B` (two servers of one cluster, on loopback).
//!
//! 1. Request-reply round trips, a one-byte payload answered at once by a responder connected to
//!    `URL_A`: from a client on the same server, then from one on `URL_B` (across a route) —
//!    what a relay between two nodes costs at the least, with nothing of Switchboard's in it.
//! 2. A key of a replicated bucket (three replicas) whose age limit is 2 s: how long after 2 s a
//!    read finds it gone, counted from before the put (read every 10 ms once a read has seen it,
//!    eight keys one after another) — how late a dead node's heartbeat disappears.
//!
//! Prints one line per figure. Bounded: ROUND_TRIPS (default 2,000) per client, eight keys.

use std::time::{Duration, Instant};

use futures::StreamExt;

fn percentile(values: &mut [f64], p: f64) -> f64 {
    values.sort_by(f64::total_cmp);
    values[((values.len() - 1) as f64 * p).round() as usize]
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(a), Some(b)) = (args.first(), args.get(1)) else {
        return Err("usage: nats-floor URL_A URL_B [ROUND_TRIPS]".into());
    };
    let trips: usize = args.get(2).map_or(Ok(2_000), |n| n.parse())?;
    let responder = async_nats::connect(a.as_str()).await?;
    let mut requests = responder.subscribe("nats-floor.echo").await?;
    let answering = responder.clone();
    tokio::spawn(async move {
        while let Some(message) = requests.next().await {
            if let Some(reply) = message.reply {
                let _ = answering.publish(reply, message.payload).await;
            }
        }
    });
    responder.flush().await?;
    for (what, url) in [("on the same server", a), ("across a route", b)] {
        let client = async_nats::connect(url.as_str()).await?;
        // Until the responder's interest has reached this client's server.
        let deadline = Instant::now() + Duration::from_secs(10);
        while client.request("nats-floor.echo", "x".into()).await.is_err() {
            if Instant::now() > deadline {
                return Err(format!("no answer through {url}").into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        for _ in 0..trips / 10 {
            client.request("nats-floor.echo", "x".into()).await?;
        }
        let mut took = Vec::with_capacity(trips);
        for _ in 0..trips {
            let sent = Instant::now();
            client.request("nats-floor.echo", "x".into()).await?;
            took.push(sent.elapsed().as_secs_f64() * 1e3);
        }
        println!(
            "request-reply {what}: p50 {:.3} ms, p99 {:.3} ms (n={trips})",
            percentile(&mut took, 0.5),
            percentile(&mut took, 0.99)
        );
    }
    let js = async_nats::jetstream::new(async_nats::connect(b.as_str()).await?);
    let age = Duration::from_secs(2);
    let bucket = js
        .create_key_value(async_nats::jetstream::kv::Config {
            bucket: "nats-floor".into(),
            max_age: age,
            num_replicas: 3,
            history: 1,
            ..Default::default()
        })
        .await?;
    let mut late = Vec::new();
    for i in 0..8 {
        let key = format!("k{i}");
        let put = Instant::now();
        bucket.put(&key, "alive".into()).await?;
        // A direct get may reach a replica that has not stored the key yet: seen first, then gone.
        while bucket.get(&key).await?.is_none() {
            if put.elapsed() > age {
                return Err(format!("key {key} never seen within {age:?}").into());
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        while bucket.get(&key).await?.is_some() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        late.push((put.elapsed().as_secs_f64() - age.as_secs_f64()) * 1e3);
    }
    println!(
        "a key with an age limit of 2 s is gone after 2 s + {:.0} ms at the median, {:.0} ms at most (n=8, read every 10 ms)",
        percentile(&mut late, 0.5),
        percentile(&mut late, 1.0)
    );
    js.delete_key_value("nats-floor").await?;
    Ok(())
}
