#if canImport(UIKit) && !os(watchOS)
import UIKit
#elseif canImport(AppKit)
import AppKit
#endif
import Synchronization

/// Calls a client's ``TetherClient/enterBackground()`` and ``TetherClient/enterForeground()``
/// from the application's own notifications, so an iOS app needs no code for it:
///
/// - UIKit (iOS, iPadOS, tvOS, visionOS, Mac Catalyst): `didEnterBackgroundNotification` and
///   `willEnterForegroundNotification`.
/// - AppKit (macOS): the workspace's `willSleepNotification` and `didWakeNotification` — a Mac app
///   keeps running when hidden, so system sleep is its background.
/// - Linux, Windows and watchOS: nothing to observe; the app calls the two methods itself.
///
/// It holds the client weakly and stops observing when released.
final class ApplicationStateObserver: Sendable {
    #if (canImport(UIKit) && !os(watchOS)) || canImport(AppKit)
    private let tokens = Mutex<[any NSObjectProtocol]>([])
    #endif

    /// Starts observing for `client` (held weakly).
    init(client: TetherClient) {
        #if canImport(UIKit) && !os(watchOS)
        let center = NotificationCenter.default
        let background = center.addObserver(forName: UIApplication.didEnterBackgroundNotification, object: nil, queue: nil) {
            [weak client] _ in client?.enterBackground()
        }
        let foreground = center.addObserver(forName: UIApplication.willEnterForegroundNotification, object: nil, queue: nil) {
            [weak client] _ in client?.enterForeground()
        }
        tokens.withLock { $0 = [background, foreground] }
        #elseif canImport(AppKit)
        let center = NSWorkspace.shared.notificationCenter
        let sleep = center.addObserver(forName: NSWorkspace.willSleepNotification, object: nil, queue: nil) {
            [weak client] _ in client?.enterBackground()
        }
        let wake = center.addObserver(forName: NSWorkspace.didWakeNotification, object: nil, queue: nil) {
            [weak client] _ in client?.enterForeground()
        }
        tokens.withLock { $0 = [sleep, wake] }
        #endif
    }

    /// Whether this platform has application notifications the observer follows.
    static var isAvailable: Bool {
        #if (canImport(UIKit) && !os(watchOS)) || canImport(AppKit)
        return true
        #else
        return false
        #endif
    }

    deinit {
        #if canImport(UIKit) && !os(watchOS)
        for token in tokens.withLock({ $0 }) { NotificationCenter.default.removeObserver(token) }
        #elseif canImport(AppKit)
        for token in tokens.withLock({ $0 }) { NSWorkspace.shared.notificationCenter.removeObserver(token) }
        #endif
    }
}
