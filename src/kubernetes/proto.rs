//! The messages of the kubelet pod-resources v1 `List` call (`proto/api.proto`), declared by hand
//! with `prost` derives.
//!
//! Only `List` and the fields it needs are here: protobuf decoding skips fields a message does not
//! declare, so the CPU, memory and topology fields are read past, not rejected. The DRA fields
//! (`dynamic_resources`, kubelet 1.31 and later) are declared: claims of NVIDIA's DRA driver are
//! GPU assignments too. Declaring these few small messages avoids a build-time `protoc` and the code generator's dependency
//! tree; the unit test below checks every declared field number against the checked-in proto.

/// gRPC path of `PodResourcesLister.List`.
pub const LIST_PATH: &str = "/v1.PodResourcesLister/List";

/// gRPC service name of the pod-resources API (what a server registers).
pub const SERVICE_NAME: &str = "v1.PodResourcesLister";

/// `ListPodResourcesRequest`: no fields.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct ListPodResourcesRequest {}

/// `ListPodResourcesResponse`: every pod on the node with the resources assigned to it.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct ListPodResourcesResponse {
    /// One entry per pod.
    #[prost(message, repeated, tag = "1")]
    pub pod_resources: Vec<PodResources>,
}

/// `PodResources`: one pod.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct PodResources {
    /// Pod name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Pod namespace.
    #[prost(string, tag = "2")]
    pub namespace: String,
    /// The pod's containers.
    #[prost(message, repeated, tag = "3")]
    pub containers: Vec<ContainerResources>,
}

/// `ContainerResources`: one container of a pod.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct ContainerResources {
    /// Container name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Device-plugin devices assigned to the container, grouped by resource name.
    #[prost(message, repeated, tag = "2")]
    pub devices: Vec<ContainerDevices>,
    /// Devices allocated to the container through resource claims (DRA).
    #[prost(message, repeated, tag = "5")]
    pub dynamic_resources: Vec<DynamicResource>,
}

/// `ContainerDevices`: the devices of one resource assigned to a container.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct ContainerDevices {
    /// Extended resource name, e.g. `nvidia.com/gpu`.
    #[prost(string, tag = "1")]
    pub resource_name: String,
    /// Device IDs as the device plugin advertised them (a GPU UUID, `nvidia0`, …).
    #[prost(string, repeated, tag = "2")]
    pub device_ids: Vec<String>,
}

/// `DynamicResource`: one resource claim of a container (DRA).
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct DynamicResource {
    /// The claim's name (a claim made from a template has a generated one).
    #[prost(string, tag = "2")]
    pub claim_name: String,
    /// The claim's namespace (the pod's).
    #[prost(string, tag = "3")]
    pub claim_namespace: String,
    /// The devices allocated to the claim on this node.
    #[prost(message, repeated, tag = "4")]
    pub claim_resources: Vec<ClaimResource>,
}

/// `ClaimResource`: one device of a claim, named by its driver, pool and device name (the names
/// of the driver's ResourceSlices).
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct ClaimResource {
    /// The CDI devices the driver made for it.
    #[prost(message, repeated, tag = "1")]
    pub cdi_devices: Vec<CdiDevice>,
    /// The DRA driver, e.g. `gpu.nvidia.com`.
    #[prost(string, tag = "2")]
    pub driver_name: String,
    /// The pool (NVIDIA's driver names it after the node).
    #[prost(string, tag = "3")]
    pub pool_name: String,
    /// The device in the pool, e.g. `gpu-0`.
    #[prost(string, tag = "4")]
    pub device_name: String,
}

/// `CDIDevice`: a fully qualified CDI device name.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct CdiDevice {
    /// e.g. `k8s.gpu.nvidia.com/device=gpu-0`.
    #[prost(string, tag = "1")]
    pub name: String,
}

/// The `List` answer as it comes off the wire, its strings as bytes: prost refuses a whole
/// message for one `string` that is not UTF-8, where a bad entry should cost that entry only.
/// [`wire::Wire::checked`] turns it into [`ListPodResourcesResponse`] without those entries. (A real
/// kubelet sends UTF-8: Go's protobuf refuses to encode anything else.)
pub(crate) mod wire {
    /// `ListPodResourcesResponse` with bytes for strings.
    #[derive(Clone, PartialEq, Eq, prost::Message)]
    pub struct Wire {
        #[prost(message, repeated, tag = "1")]
        pub pod_resources: Vec<Pod>,
    }

    /// `PodResources`.
    #[derive(Clone, PartialEq, Eq, prost::Message)]
    pub struct Pod {
        #[prost(bytes = "vec", tag = "1")]
        pub name: Vec<u8>,
        #[prost(bytes = "vec", tag = "2")]
        pub namespace: Vec<u8>,
        #[prost(message, repeated, tag = "3")]
        pub containers: Vec<Container>,
    }

    /// `ContainerResources`.
    #[derive(Clone, PartialEq, Eq, prost::Message)]
    pub struct Container {
        #[prost(bytes = "vec", tag = "1")]
        pub name: Vec<u8>,
        #[prost(message, repeated, tag = "2")]
        pub devices: Vec<Devices>,
        #[prost(message, repeated, tag = "5")]
        pub dynamic_resources: Vec<Dynamic>,
    }

    /// `ContainerDevices`.
    #[derive(Clone, PartialEq, Eq, prost::Message)]
    pub struct Devices {
        #[prost(bytes = "vec", tag = "1")]
        pub resource_name: Vec<u8>,
        #[prost(bytes = "vec", repeated, tag = "2")]
        pub device_ids: Vec<Vec<u8>>,
    }

    /// `DynamicResource`.
    #[derive(Clone, PartialEq, Eq, prost::Message)]
    pub struct Dynamic {
        #[prost(bytes = "vec", tag = "2")]
        pub claim_name: Vec<u8>,
        #[prost(bytes = "vec", tag = "3")]
        pub claim_namespace: Vec<u8>,
        #[prost(message, repeated, tag = "4")]
        pub claim_resources: Vec<Claim>,
    }

    /// `ClaimResource`.
    #[derive(Clone, PartialEq, Eq, prost::Message)]
    pub struct Claim {
        #[prost(message, repeated, tag = "1")]
        pub cdi_devices: Vec<Cdi>,
        #[prost(bytes = "vec", tag = "2")]
        pub driver_name: Vec<u8>,
        #[prost(bytes = "vec", tag = "3")]
        pub pool_name: Vec<u8>,
        #[prost(bytes = "vec", tag = "4")]
        pub device_name: Vec<u8>,
    }

    /// `CDIDevice`.
    #[derive(Clone, PartialEq, Eq, prost::Message)]
    pub struct Cdi {
        #[prost(bytes = "vec", tag = "1")]
        pub name: Vec<u8>,
    }

    /// Counts what [`Wire::checked`] leaves out.
    struct Skipped(usize);

    impl Skipped {
        /// `bytes` as text, or `None`, counted.
        fn text(&mut self, bytes: Vec<u8>) -> Option<String> {
            let text = String::from_utf8(bytes).ok();
            self.0 += usize::from(text.is_none());
            text
        }

        /// The items `f` keeps.
        fn keep<T, U>(
            &mut self,
            items: Vec<T>,
            f: impl FnMut(&mut Self, T) -> Option<U>,
        ) -> Vec<U> {
            let mut f = f;
            items.into_iter().filter_map(|item| f(self, item)).collect()
        }
    }

    impl Wire {
        /// The answer without the entries that have a string that is not UTF-8 (a pod, a
        /// container, a device list, a device ID, a claim…: the smallest entry holding it), and
        /// how many were left out.
        pub fn checked(self) -> (super::ListPodResourcesResponse, usize) {
            use super::*;
            let mut s = Skipped(0);
            let pod_resources = s.keep(self.pod_resources, |s, p| {
                Some(PodResources {
                    name: s.text(p.name)?,
                    namespace: s.text(p.namespace)?,
                    containers: s.keep(p.containers, |s, c| {
                        Some(ContainerResources {
                            name: s.text(c.name)?,
                            devices: s.keep(c.devices, |s, d| {
                                Some(ContainerDevices {
                                    resource_name: s.text(d.resource_name)?,
                                    device_ids: s.keep(d.device_ids, Skipped::text),
                                })
                            }),
                            dynamic_resources: s.keep(c.dynamic_resources, |s, d| {
                                Some(DynamicResource {
                                    claim_name: s.text(d.claim_name)?,
                                    claim_namespace: s.text(d.claim_namespace)?,
                                    claim_resources: s.keep(d.claim_resources, |s, r| {
                                        Some(ClaimResource {
                                            cdi_devices: s.keep(r.cdi_devices, |s, c| {
                                                Some(CdiDevice {
                                                    name: s.text(c.name)?,
                                                })
                                            }),
                                            driver_name: s.text(r.driver_name)?,
                                            pool_name: s.text(r.pool_name)?,
                                            device_name: s.text(r.device_name)?,
                                        })
                                    }),
                                })
                            }),
                        })
                    }),
                })
            });
            (ListPodResourcesResponse { pod_resources }, s.0)
        }
    }
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;

    /// (message, proto type, field, number) of every field declared above.
    const DECLARED: &[(&str, &str, &str, u32)] = &[
        (
            "ListPodResourcesResponse",
            "repeated PodResources",
            "pod_resources",
            1,
        ),
        ("PodResources", "string", "name", 1),
        ("PodResources", "string", "namespace", 2),
        (
            "PodResources",
            "repeated ContainerResources",
            "containers",
            3,
        ),
        ("ContainerResources", "string", "name", 1),
        (
            "ContainerResources",
            "repeated ContainerDevices",
            "devices",
            2,
        ),
        (
            "ContainerResources",
            "repeated DynamicResource",
            "dynamic_resources",
            5,
        ),
        ("ContainerDevices", "string", "resource_name", 1),
        ("ContainerDevices", "repeated string", "device_ids", 2),
        ("DynamicResource", "string", "claim_name", 2),
        ("DynamicResource", "string", "claim_namespace", 3),
        (
            "DynamicResource",
            "repeated ClaimResource",
            "claim_resources",
            4,
        ),
        ("ClaimResource", "repeated CDIDevice", "cdi_devices", 1),
        ("ClaimResource", "string", "driver_name", 2),
        ("ClaimResource", "string", "pool_name", 3),
        ("ClaimResource", "string", "device_name", 4),
        ("CDIDevice", "string", "name", 1),
    ];

    /// The body of `message NAME { … }` in the proto text.
    fn message_body<'a>(proto: &'a str, name: &str) -> &'a str {
        let start = proto
            .find(&format!("message {name} {{"))
            .unwrap_or_else(|| panic!("message {name} not in proto/api.proto"));
        let body = &proto[start..];
        &body[..body.find('}').expect("closing brace")]
    }

    #[test]
    fn field_numbers_match_the_checked_in_proto() {
        let proto = include_str!("../../proto/api.proto");
        assert!(
            proto.contains("rpc List(ListPodResourcesRequest) returns (ListPodResourcesResponse)")
        );
        assert!(proto.contains("package v1;") && proto.contains("service PodResourcesLister {"));
        assert!(proto.contains("message ListPodResourcesRequest {}"));
        for (message, ty, field, number) in DECLARED {
            let line = format!("{ty} {field} = {number};");
            assert!(
                message_body(proto, message).contains(&line),
                "{message} has no `{line}`"
            );
        }
    }

    #[test]
    fn unknown_fields_of_newer_kubelets_are_skipped() {
        // A ContainerResources with cpu_ids (field 3, packed int64) after the devices.
        let mut bytes = ContainerResources {
            name: "main".into(),
            devices: vec![ContainerDevices {
                resource_name: "nvidia.com/gpu".into(),
                device_ids: vec!["GPU-1".into()],
            }],
            dynamic_resources: vec![],
        }
        .encode_to_vec();
        bytes.extend_from_slice(&[0x1a, 0x02, 0x04, 0x05]);
        let decoded = ContainerResources::decode(bytes.as_slice()).unwrap();
        assert_eq!(decoded.name, "main");
        assert_eq!(decoded.devices[0].device_ids, ["GPU-1"]);
    }

    #[test]
    fn the_wire_form_reads_every_field_as_the_messages_do() {
        let answer = ListPodResourcesResponse {
            pod_resources: vec![PodResources {
                name: "p".into(),
                namespace: "ns".into(),
                containers: vec![ContainerResources {
                    name: "c".into(),
                    devices: vec![ContainerDevices {
                        resource_name: "nvidia.com/gpu".into(),
                        device_ids: vec!["GPU-1".into(), "GPU-2".into()],
                    }],
                    dynamic_resources: vec![DynamicResource {
                        claim_name: "claim".into(),
                        claim_namespace: "ns".into(),
                        claim_resources: vec![ClaimResource {
                            cdi_devices: vec![CdiDevice { name: "cdi".into() }],
                            driver_name: "gpu.nvidia.com".into(),
                            pool_name: "node".into(),
                            device_name: "gpu-0".into(),
                        }],
                    }],
                }],
            }],
        };
        let bytes = answer.encode_to_vec();
        assert_eq!(
            wire::Wire::decode(&bytes[..]).unwrap().checked(),
            (answer, 0)
        );
    }

    #[test]
    fn a_name_that_is_not_utf8_costs_its_entry_only() {
        use wire::*;
        let pod = |name: &[u8], ids: Vec<Vec<u8>>| Pod {
            name: name.to_vec(),
            namespace: b"ml".to_vec(),
            containers: vec![Container {
                name: b"main".to_vec(),
                devices: vec![Devices {
                    resource_name: b"nvidia.com/gpu".to_vec(),
                    device_ids: ids,
                }],
                dynamic_resources: vec![],
            }],
        };
        let bytes = Wire {
            pod_resources: vec![
                pod(b"train-0", vec![b"GPU-a".to_vec()]),
                pod(b"bad-\xff", vec![b"GPU-b".to_vec()]),
                pod(b"train-1", vec![b"GPU-c".to_vec(), b"GPU-\xfe".to_vec()]),
            ],
        }
        .encode_to_vec();
        // Decoded with strings, the whole answer is refused.
        assert!(ListPodResourcesResponse::decode(&bytes[..]).is_err());
        let (answer, skipped) = Wire::decode(&bytes[..]).unwrap().checked();
        assert_eq!(skipped, 2, "one pod, one device ID");
        let kept: Vec<(&str, Vec<&str>)> = answer
            .pod_resources
            .iter()
            .map(|p| {
                let ids = &p.containers[0].devices[0].device_ids;
                (p.name.as_str(), ids.iter().map(String::as_str).collect())
            })
            .collect();
        assert_eq!(
            kept,
            [("train-0", vec!["GPU-a"]), ("train-1", vec!["GPU-c"])]
        );
    }
}
