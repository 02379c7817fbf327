import Foundation
package import Logging
import Synchronization
@_spi(Benchmarks) package import TetherProtocol

/// A published message that may carry push parts, queued for the push worker.
package struct PushJob: Sendable {
    package var subscribeKey: String
    package var channel: String
    package var timetoken: Timetoken
    package var payload: String
    /// Which devices the job is for.
    package var scope: Scope = .all

    /// Which devices a job pushes to.
    package enum Scope: Sendable {
        /// Registered devices and suspended sessions' devices (a single server's publish).
        case all
        /// Registered devices only (a cluster node's own publish: every node pushes to the
        /// suspended sessions it holds as the message reaches it through the shared log).
        case registered
        /// Suspended sessions' devices only (a message read from the shared log).
        case held
    }
}

/// Sends the push parts of published messages (`pn_apns`, `pn_fcm`, `pn_gcm`) to the devices
/// registered on their channel, off the publish path.
///
/// A publish hands its committed message to ``messagePublished(subscribeKey:channel:timetoken:payload:)``,
/// which only appends it to a bounded queue (a full queue drops the push and counts it); the
/// worker (``run()``, one service of the server) reads the registrations and sends through
/// the providers, `concurrency` notifications at a time, retrying 429/5xx answers with
/// ``PushBackoff`` and unregistering devices whose token the gateway refuses.
package final class PushDispatcher: Sendable {
    package let settings: PushSettings
    /// Apple's provider (APNs, or the webhook), Google's (FCM, or the webhook).
    private let apple: (any PushProvider)?
    private let google: (any PushProvider)?
    private let store: any PushRegistrationStoring
    private let metrics: ServerMetrics
    private let logger: Logger
    private let stream: AsyncStream<PushJob>
    private let continuation: AsyncStream<PushJob>.Continuation
    private let state = Mutex(State())
    /// Publishes a debug report (`pn_debug`) on a channel: (subscribe key, channel, JSON text).
    private let debugPublisher: Mutex<(@Sendable (String, String, String) async -> Void)?> = Mutex(nil)
    private let jitter: @Sendable () -> Double

    private struct State {
        /// Jobs queued or being processed.
        var pending = 0
        var idleWaiters: [CheckedContinuation<Void, Never>] = []
        /// Devices of suspended WebSocket sessions, by subscribe key and channel, then by owner.
        var held: [HeldKey: [UInt64: PushDevice]] = [:]
        /// The channels each owner holds a device on (a wildcard's key is its prefix, `news.`).
        var heldBy: [UInt64: [HeldKey]] = [:]
        /// Devices held on wildcard subscriptions (`news.*`), by subscribe key and prefix
        /// (`news.`), then by owner: few, and matched by prefix.
        var heldPrefixes: [HeldKey: [UInt64: PushDevice]] = [:]

        /// Whether a device is held on `channel`, exactly or by a wildcard.
        func holds(_ subscribeKey: String, _ channel: String) -> Bool {
            if held.isEmpty && heldPrefixes.isEmpty { return false }
            if held[HeldKey(subscribeKey: subscribeKey, channel: channel)] != nil { return true }
            return heldPrefixes.keys.contains { $0.subscribeKey == subscribeKey && channel.hasPrefix($0.channel) }
        }
        /// Whether each owner may still read a channel (its grant or token, checked when a
        /// message is pushed: a revoked grant or an expired token stops the pushes).
        var mayRead: [UInt64: @Sendable (String) -> Bool] = [:]
    }

    private struct HeldKey: Hashable {
        var subscribeKey: String
        var channel: String
    }

    package init(settings: PushSettings, apple: (any PushProvider)?, google: (any PushProvider)?, store: any PushRegistrationStoring,
                 metrics: ServerMetrics, logger: Logger, jitter: @escaping @Sendable () -> Double = { Double.random(in: 0..<1) }) {
        self.settings = settings
        self.apple = apple
        self.google = google
        self.store = store
        self.metrics = metrics
        self.logger = logger
        self.jitter = jitter
        (stream, continuation) = AsyncStream.makeStream(of: PushJob.self, bufferingPolicy: .bufferingOldest(settings.queueCapacity))
    }

    /// Where `pn_debug` reports go (the server sets it to a publish that is not stored).
    package func setDebugPublisher(_ publisher: @escaping @Sendable (String, String, String) async -> Void) {
        debugPublisher.withLock { $0 = publisher }
    }

    /// Whether any provider is configured.
    package var isSending: Bool { apple != nil || google != nil }

    /// Jobs queued or in progress (for tests and metrics).
    package var pendingJobs: Int { state.withLock { $0.pending } }

    /// A suspended WebSocket session (`owner`) asked for what arrives on `channels` to be pushed
    /// to `device` until ``releaseDevice(owner:)``: the device receives every message published
    /// there — its `pn_apns` / `pn_fcm` part when it has one, otherwise a notification made from
    /// the message (``defaultNotification(_:channel:timetoken:apple:)``). Not stored: a held device
    /// lasts as long as the session, which does not outlive the process.
    ///
    /// `channels` are concrete channels (a session's groups expanded by the caller) and wildcard
    /// patterns (`news.*`, matching every channel under `news.`).
    package func holdDevice(_ device: PushDevice, channels: [String], owner: UInt64,
                            mayRead: @escaping @Sendable (String) -> Bool = { _ in true }) {
        releaseDevice(owner: owner)
        let keys = channels.map { name in
            HeldKey(subscribeKey: device.subscribeKey, channel: NameRules.isWildcard(name) ? String(name.dropLast()) : name)
        }
        let wildcards = Set(channels.filter(NameRules.isWildcard).map { String($0.dropLast()) })
        state.withLock { s in
            for key in keys {
                if wildcards.contains(key.channel) {
                    s.heldPrefixes[key, default: [:]][owner] = device
                } else {
                    s.held[key, default: [:]][owner] = device
                }
            }
            s.heldBy[owner] = keys
            s.mayRead[owner] = mayRead
        }
    }

    /// The session `owner` is resumed, ended or expired: its device is no longer pushed to.
    package func releaseDevice(owner: UInt64) {
        state.withLock { s in
            for key in s.heldBy.removeValue(forKey: owner) ?? [] {
                s.held[key]?[owner] = nil
                if s.held[key]?.isEmpty == true { s.held[key] = nil }
                s.heldPrefixes[key]?[owner] = nil
                if s.heldPrefixes[key]?.isEmpty == true { s.heldPrefixes[key] = nil }
            }
            s.mayRead[owner] = nil
        }
    }

    /// Devices held on a channel (exactly, or by a wildcard) whose sessions may still read it;
    /// a device held both ways is pushed once.
    private func heldDevices(subscribeKey: String, channel: String) -> [PushDevice] {
        let held = state.withLock { s in
            var owners = s.held[HeldKey(subscribeKey: subscribeKey, channel: channel)] ?? [:]
            for (key, devices) in s.heldPrefixes where key.subscribeKey == subscribeKey && channel.hasPrefix(key.channel) {
                owners.merge(devices) { current, _ in current }
            }
            return owners.map { (device: $0.value, mayRead: s.mayRead[$0.key]) }
        }
        // Checked outside the lock: a check reads the access manager.
        return held.filter { $0.mayRead?(channel) ?? true }.map(\.device)
    }

    /// Queues a committed message when it may carry push parts or a suspended session's device
    /// waits on its channel. Never waits: a full queue drops the push (counted as `dropped`).
    ///
    /// `includingHeld` false (a cluster): the suspended sessions' devices are left to
    /// ``heldMessageArrived(subscribeKey:channel:timetoken:payload:)``, which every node calls for
    /// the messages its shared-log reader delivers, since each node holds its own sessions.
    package func messagePublished(subscribeKey: String, channel: String, timetoken: Timetoken, payload: String, includingHeld: Bool = true) {
        let held = includingHeld && isSending && state.withLock { $0.holds(subscribeKey, channel) }
        guard held || (payload.utf8.count > 8 && Self.contains(payload, "\"pn_")) else { return }
        guard isSending || Self.contains(payload, "\"pn_debug\"") else { return }
        enqueue(PushJob(subscribeKey: subscribeKey, channel: channel, timetoken: timetoken, payload: payload,
                        scope: includingHeld ? .all : .registered))
    }

    /// Whether a suspended session holds a device here (a cheap check before a batch).
    package var holdsDevices: Bool { isSending && state.withLock { !$0.held.isEmpty || !$0.heldPrefixes.isEmpty } }

    /// A cluster node's shared-log reader delivered a message (any node's publish): queued for
    /// the suspended sessions this node holds on its channel, if any.
    package func heldMessageArrived(subscribeKey: String, channel: String, timetoken: Timetoken, payload: String) {
        guard isSending, state.withLock({ $0.holds(subscribeKey, channel) }) else { return }
        enqueue(PushJob(subscribeKey: subscribeKey, channel: channel, timetoken: timetoken, payload: payload, scope: .held))
    }

    private func enqueue(_ job: PushJob) {
        state.withLock { $0.pending += 1 }
        switch continuation.yield(job) {
        case .enqueued: break
        case .dropped, .terminated:
            metrics.recordPush(provider: "queue", outcome: "dropped")
            finishJob()
        @unknown default:
            finishJob()
        }
    }

    /// Whether `text` contains `needle`, compared as UTF-8 bytes. Every publish asks this of its
    /// payload; Foundation's `contains(_:)` bridged the payload to `NSString` for it (~1.7 % of a
    /// publish's CPU). Bytes, not characters: a combining mark right after the needle does not
    /// hide it (that payload's push part is then parsed and found not to be one).
    package static func contains(_ text: String, _ needle: StaticString) -> Bool {
        let pattern = UnsafeBufferPointer(start: needle.utf8Start, count: needle.utf8CodeUnitCount)
        var text = text  // `withUTF8` reads a native string's bytes in place
        return text.withUTF8 { bytes in
            guard !pattern.isEmpty else { return true }
            guard bytes.count >= pattern.count else { return false }
            for start in 0...(bytes.count - pattern.count)
            where bytes[start] == pattern[0] && UnsafeBufferPointer(rebasing: bytes[start..<start + pattern.count]).elementsEqual(pattern) {
                return true
            }
            return false
        }
    }

    /// Waits until no job is queued or in progress (tests).
    package func waitUntilIdle() async {
        await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
            let resumeNow = state.withLock { s -> Bool in
                if s.pending == 0 { return true }
                s.idleWaiters.append(c)
                return false
            }
            if resumeNow { c.resume() }
        }
    }

    private func finishJob() {
        let waiters = state.withLock { s -> [CheckedContinuation<Void, Never>] in
            s.pending -= 1
            guard s.pending == 0 else { return [] }
            defer { s.idleWaiters = [] }
            return s.idleWaiters
        }
        for waiter in waiters { waiter.resume() }
    }

    /// Processes queued jobs until ``finish()``; then releases the providers' connections.
    package func run() async {
        for await job in stream {
            if Task.isCancelled {
                finishJob()
                continue
            }
            await process(job)
            finishJob()
        }
        await apple?.shutdown()
        await google?.shutdown()
    }

    /// Stops taking jobs; ``run()`` returns once the queue is drained.
    package func finish() { continuation.finish() }

    // MARK: - One message

    private struct Outcome: Sendable {
        var device: PushDevice
        var provider: String
        var result: String
    }

    private func process(_ job: PushJob) async {
        let parsed = try? JSONValue(parsing: job.payload)
        let message = parsed?.objectValue ?? [:]
        let applePart = message["pn_apns"].flatMap { $0.objectValue != nil ? $0 : nil }
        let googlePart = (message["pn_fcm"] ?? message["pn_gcm"]).flatMap { $0.objectValue != nil ? $0 : nil }
        let debug = message["pn_debug"]?.boolValue == true
        var outcomes: [Outcome] = []
        var work: [(PushNotification, any PushProvider)] = []
        // Suspended sessions' devices: every message, with a notification made from it when it
        // carries no push part for the device's gateway.
        var exceptions = Set<String>()
        for part in [message["pn_exceptions"], applePart?["pn_exceptions"], googlePart?["pn_exceptions"]] {
            for token in part?.arrayValue ?? [] { if let token = token.stringValue { exceptions.insert(token) } }
        }
        var heldTokens = Set<String>()
        let held = job.scope == .registered ? [] : heldDevices(subscribeKey: job.subscribeKey, channel: job.channel)
        for device in held where !exceptions.contains(device.token) {
            heldTokens.insert(device.token)
            switch device.gateway {
            case .apns, .apns2:
                guard let apple else { continue }
                let part = applePart ?? Self.defaultNotification(parsed, channel: job.channel, timetoken: job.timetoken, apple: true)
                for notification in appleNotifications(part, device: device, job: job) { work.append((notification, apple)) }
            case .gcm:
                guard let google else { continue }
                let part = googlePart ?? Self.defaultNotification(parsed, channel: job.channel, timetoken: job.timetoken, apple: false)
                work.append((PushNotification(device: device, channel: job.channel, messageTimetoken: job.timetoken, payload: part), google))
            case .mpns:
                continue
            }
        }
        guard applePart != nil || googlePart != nil || !work.isEmpty else { return }
        var devices: [PushDevice] = []
        do {
            // A held-only job leaves the registered devices (and `pn_debug`) to the node that
            // took the publish.
            if job.scope != .held, applePart != nil || googlePart != nil {
                devices = try await store.pushDevices(subscribeKey: job.subscribeKey, channel: job.channel, limit: settings.maxDevicesPerChannel)
            }
        } catch {
            logger.error("push: reading registrations failed", metadata: ["channel": "\(job.channel)", "error": "\(error)"])
            return
        }
        for device in devices where !heldTokens.contains(device.token) {
            if exceptions.contains(device.token) {
                outcomes.append(Outcome(device: device, provider: "-", result: "excluded"))
                continue
            }
            switch device.gateway {
            case .apns, .apns2:
                guard let applePart else { continue }
                guard let apple else {
                    outcomes.append(Outcome(device: device, provider: "-", result: "skipped: no provider for Apple devices"))
                    continue
                }
                for notification in appleNotifications(applePart, device: device, job: job) {
                    work.append((notification, apple))
                }
            case .gcm:
                guard let googlePart else { continue }
                guard let google else {
                    outcomes.append(Outcome(device: device, provider: "-", result: "skipped: no provider for Google devices"))
                    continue
                }
                work.append((PushNotification(device: device, channel: job.channel, messageTimetoken: job.timetoken, payload: googlePart), google))
            case .mpns:
                outcomes.append(Outcome(device: device, provider: "-", result: "skipped: MPNS is not sent"))
            }
        }
        let delivered = await withTaskGroup(of: Outcome.self, returning: [Outcome].self) { group in
            var results: [Outcome] = []
            var next = 0
            let width = min(settings.concurrency, work.count)
            while next < width {
                let (notification, provider) = work[next]
                group.addTask { await self.deliver(notification, provider) }
                next += 1
            }
            while let outcome = await group.next() {
                results.append(outcome)
                if next < work.count {
                    let (notification, provider) = work[next]
                    group.addTask { await self.deliver(notification, provider) }
                    next += 1
                }
            }
            return results
        }
        outcomes += delivered
        if debug, job.scope != .held { await publishDebug(job, devices: devices.count, outcomes: outcomes) }
    }

    /// The notification a suspended session's device gets for a message without a push part for
    /// its gateway: the channel as the title, the message's text as the body (the message itself
    /// when it is a string, its `text` member when it is an object with one, otherwise "New
    /// message"; at most 200 characters), and the channel and timetoken for the app to open it.
    static func defaultNotification(_ message: JSONValue?, channel: String, timetoken: Timetoken, apple: Bool) -> JSONValue {
        var text = "New message"
        if let string = message?.stringValue {
            text = string
        } else if let string = message?["text"]?.stringValue {
            text = string
        }
        if text.count > 200 { text = String(text.prefix(199)) + "…" }
        let reference: JSONValue = ["channel": .string(channel), "timetoken": .string(timetoken.description)]
        if apple {
            return ["aps": ["alert": ["title": .string(channel), "body": .string(text)], "thread-id": .string(channel), "sound": "default"],
                    "tether": reference]
        }
        return ["notification": ["title": .string(channel), "body": .string(text)], "data": reference]
    }

    /// The notifications of an Apple device: one per matching `pn_push` target (APNs2 devices
    /// whose environment and topic a target names), or — without `pn_push` — one with the
    /// device's own (v1 devices: production and the configured topic).
    private func appleNotifications(_ part: JSONValue, device: PushDevice, job: PushJob) -> [PushNotification] {
        let environment = device.gateway == .apns2 ? device.environment : "production"
        let topic = device.gateway == .apns2 ? device.topic : ""
        var pushType = "alert"
        if let targets = part["pn_push"]?.arrayValue, !targets.isEmpty {
            // The first entry that names this device (or names none) sets its push type: an
            // entry for another topic (a VoIP app's) says nothing about this device.
            var matched = false
            for target in targets where !matched {
                let names = target["targets"]?.arrayValue ?? []
                matched = names.isEmpty || names.contains { name in
                    let env = name["environment"]?.stringValue ?? "development"
                    return device.gateway == .apns || (name["topic"]?.stringValue == topic && env == environment)
                }
                if matched, let type = target["push_type"]?.stringValue { pushType = type }
            }
            guard matched else { return [] }
        }
        return [PushNotification(device: device, channel: job.channel, messageTimetoken: job.timetoken, payload: part,
                                 environment: environment, topic: topic, pushType: pushType)]
    }

    /// Sends one notification with retries; a refused token unregisters the device.
    private func deliver(_ notification: PushNotification, _ provider: any PushProvider) async -> Outcome {
        var attempt = 1
        while true {
            let result = await provider.send(notification)
            switch result {
            case .sent:
                metrics.recordPush(provider: provider.name, outcome: "sent")
                return Outcome(device: notification.device, provider: provider.name, result: "sent")
            case .invalidToken(let reason):
                metrics.recordPush(provider: provider.name, outcome: "unregistered")
                logger.info("push: token refused, device unregistered",
                            metadata: ["provider": "\(provider.name)", "reason": "\(reason)", "channel": "\(notification.channel)"])
                _ = try? await store.removePushDevice(notification.device)
                return Outcome(device: notification.device, provider: provider.name, result: "unregistered: \(reason)")
            case .failed(let reason):
                metrics.recordPush(provider: provider.name, outcome: "failed")
                logger.warning("push: notification refused", metadata: ["provider": "\(provider.name)", "reason": "\(reason)"])
                return Outcome(device: notification.device, provider: provider.name, result: "failed: \(reason)")
            case .retryable(let reason, let retryAfter):
                guard attempt < settings.maxAttempts, !Task.isCancelled else {
                    metrics.recordPush(provider: provider.name, outcome: "failed")
                    logger.warning("push: gave up after retries", metadata: ["provider": "\(provider.name)", "reason": "\(reason)",
                                                                            "attempts": "\(attempt)"])
                    return Outcome(device: notification.device, provider: provider.name, result: "failed: \(reason)")
                }
                metrics.recordPush(provider: provider.name, outcome: "retried")
                let delay = settings.backoff.delay(afterAttempt: attempt, jitter: jitter(), retryAfter: retryAfter)
                do { try await Task.sleep(for: delay) } catch {
                    return Outcome(device: notification.device, provider: provider.name, result: "failed: cancelled")
                }
                attempt += 1
            }
        }
    }

    /// The most devices a `pn_debug` report lists.
    static let debugResultLimit = 100

    /// A token as a `pn_debug` report shows it: its first 6 and last 4 characters.
    static func masked(_ token: String) -> String {
        guard token.count > 12 else { return String(repeating: "*", count: token.count) }
        return token.prefix(6) + "…" + token.suffix(4)
    }

    /// `pn_debug`: one report on `{channel}-pndebug` listing what each device got.
    private func publishDebug(_ job: PushJob, devices: Int, outcomes: [Outcome]) async {
        guard let publisher = debugPublisher.withLock({ $0 }) else { return }
        var w = JSONWriter(capacity: 128 + outcomes.count * 96)
        w.raw("{\"message_timetoken\":")
        w.timetokenString(job.timetoken)
        w.raw(",\"devices\":")
        w.number(devices)
        // Bounded (a channel may have 100,000 devices), and without whole tokens: whoever reads
        // `-pndebug` must not collect the tokens, which are the capability to list and remove a
        // device's registrations (docs/push.md).
        w.raw(",\"omitted\":")
        w.number(max(0, outcomes.count - Self.debugResultLimit))
        w.raw(",\"results\":[")
        for (i, outcome) in outcomes.prefix(Self.debugResultLimit).enumerated() {
            if i > 0 { w.raw(",") }
            w.raw("{\"token\":")
            w.string(Self.masked(outcome.device.token))
            w.raw(",\"type\":")
            w.string(outcome.device.gateway.rawValue)
            w.raw(",\"provider\":")
            w.string(outcome.provider)
            w.raw(",\"result\":")
            w.string(outcome.result)
            w.raw("}")
        }
        w.raw("]}")
        await publisher(job.subscribeKey, job.channel + "-pndebug", String(decoding: w.bytes, as: UTF8.self))
    }
}
