#if os(Linux)
import CTetherNetlink
import Foundation
import Glibc
import Synchronization

/// ``NetworkMonitor`` on Linux, from the kernel's rtnetlink link events (`RTMGRP_LINK`).
///
/// The network is **up** while at least one watched interface is administratively up and running
/// (`IFF_UP` and `IFF_RUNNING`). Loopback is ignored unless `includeLoopback` is set (tests that
/// run client and server in one network namespace watch `lo`). The socket is read on its own
/// thread, so no cooperative thread ever blocks; it stops when the stream's consumer goes away.
public struct RTNetlinkNetworkMonitor: NetworkMonitor {
    /// Watch only these interfaces (nil: every interface).
    public var interfaces: Set<String>?
    /// Count the loopback interface as a network.
    public var includeLoopback: Bool

    /// Creates a monitor (no socket until ``pathUpdates()`` is iterated).
    public init(interfaces: Set<String>? = nil, includeLoopback: Bool = false) {
        self.interfaces = interfaces
        self.includeLoopback = includeLoopback
    }

    /// Link changes, starting with the current status; finishes at once if netlink is unavailable.
    public func pathUpdates() -> AsyncStream<NetworkPathStatus> {
        let (stream, continuation) = AsyncStream.makeStream(of: NetworkPathStatus.self, bufferingPolicy: .bufferingNewest(8))
        let stop = Atomic<Bool>(false)
        let box = StopFlag(stop: stop)
        continuation.onTermination = { _ in box.set() }
        let filter = (interfaces, includeLoopback)
        let thread = Thread {
            Self.readLoop(filter: filter, stop: box, continuation: continuation)
        }
        thread.name = "tether.rtnetlink"
        thread.start()
        return stream
    }

    private final class StopFlag: Sendable {
        let stop: Atomic<Bool>
        init(stop: consuming Atomic<Bool>) { self.stop = stop }
        func set() { stop.store(true, ordering: .relaxed) }
        var isSet: Bool { stop.load(ordering: .relaxed) }
    }

    private static func readLoop(filter: (Set<String>?, Bool), stop: StopFlag, continuation: AsyncStream<NetworkPathStatus>.Continuation) {
        let fd = socket(AF_NETLINK, Int32(SOCK_RAW.rawValue) | Int32(SOCK_CLOEXEC.rawValue), NETLINK_ROUTE)
        guard fd >= 0 else { continuation.finish(); return }
        defer { close(fd) }
        var address = sockaddr_nl()
        address.nl_family = sa_family_t(AF_NETLINK)
        address.nl_groups = UInt32(RTMGRP_LINK)
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_nl>.size)) }
        }
        guard bound == 0 else { continuation.finish(); return }
        // Ask for every link once; replies and later notifications are parsed the same way.
        var request = [UInt8](repeating: 0, count: Int(ctether_nlmsg_align(UInt32(MemoryLayout<nlmsghdr>.size))) + MemoryLayout<ifinfomsg>.size)
        request.withUnsafeMutableBytes { raw in
            let header = raw.baseAddress!.assumingMemoryBound(to: nlmsghdr.self)
            header.pointee.nlmsg_len = UInt32(raw.count)
            header.pointee.nlmsg_type = UInt16(RTM_GETLINK)
            header.pointee.nlmsg_flags = UInt16(NLM_F_REQUEST | NLM_F_DUMP)
            header.pointee.nlmsg_seq = 1
            raw.storeBytes(of: UInt8(AF_UNSPEC), toByteOffset: Int(ctether_nlmsg_hdrlen()), as: UInt8.self)
        }
        _ = request.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, 0) }

        var links: [Int32: (name: String, up: Bool, loopback: Bool)] = [:]
        var last: NetworkPathStatus?
        var lastUsable: Set<Int32> = []
        var dumped = false
        var buffer = [UInt8](repeating: 0, count: 64 * 1024)
        while !stop.isSet {
            var descriptor = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            let ready = poll(&descriptor, 1, 200)
            if ready < 0 && errno != EINTR { break }
            guard ready > 0 else { continue }
            let count = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            guard count > 0 else { continue }
            let sawDone = buffer.withUnsafeBytes { raw in parse(raw.prefix(count), into: &links) }
            // The first answer is the dump of every link; report only once it is complete.
            dumped = dumped || sawDone
            guard dumped else { continue }
            let usable = Set(links.filter { _, link in
                guard link.up else { return false }
                if link.loopback && !filter.1 { return false }
                if let names = filter.0 { return names.contains(link.name) }
                return true
            }.keys)
            let status: NetworkPathStatus = usable.isEmpty ? .down : .up
            if status != last {
                last = status
                continuation.yield(status)
            } else if status == .up, usable != lastUsable {
                // Still up, over different interfaces (Wi-Fi gone, cellular remains).
                continuation.yield(.changed)
            }
            lastUsable = usable
        }
        continuation.finish()
    }

    /// Parses link messages; returns whether the batch ended a dump (`NLMSG_DONE`).
    private static func parse(_ bytes: Slice<UnsafeRawBufferPointer>, into links: inout [Int32: (name: String, up: Bool, loopback: Bool)])
        -> Bool
    {
        var sawDone = false
        let raw = UnsafeRawBufferPointer(rebasing: bytes)
        let headerLength = Int(ctether_nlmsg_hdrlen())
        var offset = 0
        while offset + MemoryLayout<nlmsghdr>.size <= raw.count {
            let header = raw.loadUnaligned(fromByteOffset: offset, as: nlmsghdr.self)
            let length = Int(header.nlmsg_len)
            guard length >= MemoryLayout<nlmsghdr>.size, offset + length <= raw.count else { return sawDone }
            let type = Int32(header.nlmsg_type)
            if type == Int32(NLMSG_DONE) || type == Int32(NLMSG_ERROR) { sawDone = true }
            if type == Int32(RTM_NEWLINK) || type == Int32(RTM_DELLINK), length >= headerLength + MemoryLayout<ifinfomsg>.size {
                let info = raw.loadUnaligned(fromByteOffset: offset + headerLength, as: ifinfomsg.self)
                if type == Int32(RTM_DELLINK) {
                    links[info.ifi_index] = nil
                } else {
                    var name = links[info.ifi_index]?.name ?? "if\(info.ifi_index)"
                    var attribute = offset + headerLength + Int(ctether_nlmsg_align(UInt32(MemoryLayout<ifinfomsg>.size)))
                    while attribute + MemoryLayout<rtattr>.size <= offset + length {
                        let header = raw.loadUnaligned(fromByteOffset: attribute, as: rtattr.self)
                        let attributeLength = Int(header.rta_len)
                        guard attributeLength >= MemoryLayout<rtattr>.size else { break }
                        if Int32(header.rta_type) == Int32(IFLA_IFNAME) {
                            let start = attribute + MemoryLayout<rtattr>.size
                            let end = min(attribute + attributeLength, offset + length)
                            let text = raw[start..<end].prefix { $0 != 0 }
                            name = String(decoding: text, as: UTF8.self)
                        }
                        attribute += Int(ctether_nlmsg_align(UInt32(attributeLength)))
                    }
                    let flags = info.ifi_flags
                    let up = flags & UInt32(IFF_UP.rawValue) != 0 && flags & UInt32(IFF_RUNNING.rawValue) != 0
                    links[info.ifi_index] = (name, up, flags & UInt32(IFF_LOOPBACK.rawValue) != 0)
                }
            }
            offset += Int(ctether_nlmsg_align(UInt32(length)))
        }
        return sawDone
    }
}
#endif
