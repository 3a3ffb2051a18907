//! Property test: random sequences of operations on a channel behave like a
//! model (one FIFO of (payload, weight) per key, bounded by the capacity).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use rlinf_channel::channel::parse_message;
use rlinf_channel::{Channel, ChannelError, ChannelOptions};

static COUNTER: AtomicU64 = AtomicU64::new(0);
const CAPACITY: u32 = 3;

#[derive(Debug, Clone)]
enum Op {
    Put {
        key: u8,
        payload: Vec<u8>,
        weight: i64,
    },
    Get {
        key: u8,
    },
    Batch {
        key: u8,
        target: i64,
    },
    Qsize {
        key: u8,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (
            0u8..3,
            proptest::collection::vec(any::<u8>(), 0..200),
            0i64..3
        )
            .prop_map(|(key, payload, weight)| Op::Put {
                key,
                payload,
                weight
            }),
        (0u8..3).prop_map(|key| Op::Get { key }),
        (0u8..3, 1i64..5).prop_map(|(key, target)| Op::Batch { key, target }),
        (0u8..3).prop_map(|key| Op::Qsize { key }),
    ]
}

fn payload_of(image: &[u8]) -> Vec<u8> {
    let m = parse_message(image).unwrap();
    image[m.header.0..m.header.0 + m.header.1].to_vec()
}

/// What get_batch should take from the front of `q`: Ok(count), or the error kind.
fn model_batch(q: &VecDeque<(Vec<u8>, i64)>, target: i64) -> Result<usize, &'static str> {
    let mut acc = 0;
    for (i, (_, w)) in q.iter().enumerate() {
        if acc + w > target {
            return Err("overshoot");
        }
        acc += w;
        if acc >= target {
            return Ok(i + 1);
        }
    }
    Err("wait")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn channel_matches_model(ops in proptest::collection::vec(op(), 1..40)) {
        let name = format!("model{}", COUNTER.fetch_add(1, Ordering::Relaxed));
        let opts = ChannelOptions { max_lanes: 4, lane_capacity: CAPACITY, max_blocks: 32, arena_bytes: 1 << 20, user_tag: 0 };
        let ch = Channel::create(&format!("prop{}", std::process::id()), &name, opts).unwrap();
        let mut model: HashMap<u8, VecDeque<(Vec<u8>, i64)>> = HashMap::new();
        for op in ops {
            match op {
                Op::Put { key, payload, weight } => {
                    let lane = ch.lane(&[key]).unwrap();
                    let q = model.entry(key).or_default();
                    let r = ch.put(lane, &payload, &[], weight, None, true);
                    if q.len() < CAPACITY as usize {
                        prop_assert!(r.is_ok(), "{r:?}");
                        q.push_back((payload, weight));
                    } else {
                        prop_assert!(matches!(r, Err(ChannelError::Full)), "{r:?}");
                    }
                }
                Op::Get { key } => {
                    let lane = ch.lane(&[key]).unwrap();
                    let r = ch.get(lane, None, true);
                    match model.entry(key).or_default().pop_front() {
                        Some((p, _)) => prop_assert_eq!(payload_of(r.unwrap().bytes()), p),
                        None => prop_assert!(matches!(r, Err(ChannelError::Empty))),
                    }
                }
                Op::Batch { key, target } => {
                    let lane = ch.lane(&[key]).unwrap();
                    let q = model.entry(key).or_default();
                    let r = ch.get_batch(lane, target, Some(Duration::from_millis(1)));
                    match model_batch(q, target) {
                        Ok(n) => {
                            let got: Vec<Vec<u8>> = r.unwrap().iter().map(|l| payload_of(l.bytes())).collect();
                            let want: Vec<Vec<u8>> = q.drain(..n).map(|(p, _)| p).collect();
                            prop_assert_eq!(got, want);
                        }
                        Err("overshoot") => prop_assert!(matches!(r, Err(ChannelError::Invalid(_))), "{r:?}"),
                        Err(_) => prop_assert!(matches!(r, Err(ChannelError::Timeout)), "{r:?}"),
                    }
                }
                Op::Qsize { key } => {
                    let lane = ch.lane(&[key]).unwrap();
                    prop_assert_eq!(ch.qsize(lane).unwrap() as usize, model.entry(key).or_default().len());
                }
            }
        }
        let s = ch.stats().unwrap();
        prop_assert_eq!(s.leased_blocks + s.writing_blocks, 0);
        prop_assert_eq!(s.queued_blocks as usize, model.values().map(VecDeque::len).sum::<usize>());
    }
}
