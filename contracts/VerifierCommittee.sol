// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {Ownable} from "@openzeppelin/contracts/access/Ownable.sol";
import {ReentrancyGuard} from "@openzeppelin/contracts/utils/ReentrancyGuard.sol";
import {EIP712} from "@openzeppelin/contracts/utils/cryptography/EIP712.sol";
import {Address} from "@openzeppelin/contracts/utils/Address.sol";
import {Checkpoints} from "@openzeppelin/contracts/utils/structs/Checkpoints.sol";
import {SafeCast} from "@openzeppelin/contracts/utils/math/SafeCast.sol";
import {Report, SigLib, InvalidSignature, DuplicateSigner, SignersNotSorted} from "./lib/QuarryTypes.sol";
import {IVerifierCommittee} from "./interfaces/IVerifierCommittee.sol";
import {IArbitration} from "./interfaces/IArbitration.sol";
import {IGPURegistry} from "./interfaces/IGPURegistry.sol";
import {IPaymentEscrow} from "./interfaces/IPaymentEscrow.sol";
import {ITaskRegistry, Task} from "./interfaces/ITaskRegistry.sol";
import {OneTimeWiring} from "./lib/OneTimeWiring.sol";

/// @notice Everything Quarry keeps about a verifier.
struct VerifierInfo {
    /// @dev Bonded wei, slashable until withdrawn.
    uint256 stake;
    /// @dev Voting weight while seated: the stake bonded at registration.
    uint256 weight;
    /// @dev First epoch in which the verifier votes (0: no registration).
    uint64 activeFrom;
    /// @dev First epoch in which it no longer votes (`type(uint64).max` while seated).
    uint64 activeUntil;
    /// @dev When the stake may be withdrawn (0 while seated).
    uint64 withdrawableAt;
}

/// @title VerifierCommittee
/// @notice Staked verifiers, epochs and leaders, quorum-signed challenge-set commitments and
/// reputation reports, and the slashing of equivocating or idle members.
/// EIP-712 domain `{name: "Quarry", version: "1", chainId, verifyingContract: this}`.
/// @dev Membership is decided per epoch, so no one can join to sway a decision already under
/// way:
/// - a join or an exit takes effect at the start of epoch `currentEpoch() + activationDelay`,
///   and at most `churnLimit` verifiers may be activated at one epoch (Ethereum's validator
///   churn limit); the slots go by stake, not by arrival: at a full boundary a join with more
///   stake displaces the pending join with the least, so holding a boundary's slots against
///   a join of stake S takes `churnLimit` joins of more than S each;
/// - the committee of an epoch (its snapshot) is fixed once the epoch starts: a member's weight
///   is the stake it bonded, and a quorum is more than two thirds of the snapshot's total weight
///   (by stake, not by head count);
/// - when `maxMembers` seats are taken, a newcomer with more stake displaces the member with the
///   least (top-N by stake) at the same boundary;
/// - Arbitration may penalize a member that left an expired dispute without a vote: it loses its
///   seat, and once it has more than `idleStrikesAllowed` strikes, `idleSlashBps` of its stake.
/// Epoch rules: `commitChallengeSet` accepts only `epoch == currentEpoch() + 1`, signed by the
/// current snapshot; `submitReputation` accepts only an epoch newer than the last reported one,
/// signed by that epoch's snapshot. A verifier leaving keeps its stake bonded (slashable for
/// equivocation and absence) until every dispute its seat could judge has expired, plus
/// `unbondingPeriod`. A member's weight never exceeds its remaining stake, so a member slashed
/// to nothing no longer votes, even in the snapshots it belonged to.
contract VerifierCommittee is IVerifierCommittee, Ownable, ReentrancyGuard, EIP712, OneTimeWiring {
    using Checkpoints for Checkpoints.Trace208;

    bytes32 public constant CHALLENGE_SET_TYPEHASH = keccak256("ChallengeSet(uint256 epoch,bytes32 challengeSetHash)");
    bytes32 public constant REPORT_TYPEHASH =
        keccak256("Report(uint256 epoch,address[] miners,uint16[] scoresBps,bytes32 evidenceRoot)");
    /// @notice Hard cap on the members of one epoch.
    uint256 public constant MAX_MEMBERS_CAP = 64;
    /// @notice Hard cap on seats: the members plus verifiers whose exit has not taken effect.
    uint256 public constant MAX_SEATS = 128;
    /// @notice Most miners in one report.
    uint256 public constant MAX_REPORT_MINERS = 256;
    uint16 public constant BPS = 10_000;
    /// @notice A report's score for a miner whose challenge went unanswered within
    /// `challengeAnswerWindow`: unavailability, not a reputation (GPURegistry.recordMissed).
    uint16 public constant MISSED = type(uint16).max;
    /// @notice The share of client shards (bps) every sitting member audits on every task
    /// unpaid (verifier/audits.py `DEFAULT_AUDIT_RATE_BPS`): a client pays only for the rate it
    /// buys above it ({raiseAuditRate}).
    uint16 public constant BASE_AUDIT_RATE_BPS = 1000;

    /// @notice Least stake (wei) to register.
    uint256 public minVerifierStake;
    /// @notice Seconds a leaving verifier's stake stays bonded after the last dispute its seat
    /// could judge has expired (its last epoch's end plus Arbitration's dispute timeout).
    uint64 public unbondingPeriod;
    /// @notice Seconds per epoch.
    uint64 public epochDuration;
    /// @notice Start of epoch 0.
    uint64 public genesisTime;
    /// @notice Seconds a challenged miner has, from the block that posted its challenge task,
    /// to submit its answer: members report a challenge missed only once this has passed
    /// (off-chain rule, read here so every member applies the same one). Below `epochDuration`.
    uint64 public challengeAnswerWindow;
    /// @notice Most members of one epoch (<= MAX_MEMBERS_CAP).
    uint256 public maxMembers = MAX_MEMBERS_CAP;
    /// @notice Epochs from a join or exit request to the boundary where it takes effect (>= 1).
    uint64 public activationDelay = 1;
    /// @notice Most verifiers activated at one epoch boundary (>= 1).
    uint32 public churnLimit = 4;
    /// @notice Absences a member may have before each further one also costs stake.
    uint32 public idleStrikesAllowed;
    /// @notice Share of its stake an absent member loses past `idleStrikesAllowed`.
    uint16 public idleSlashBps = 1000;
    /// @notice Receives the non-prover half of an equivocation slash (owner when unset).
    address public treasury;

    IGPURegistry public gpuRegistry;
    IPaymentEscrow public escrow;
    /// @notice May penalize members absent from an expired dispute.
    address public arbitration;

    /// @notice Chain of commitments; seeds `leaderOf`.
    bytes32 public lastCommitHash;
    mapping(uint256 epoch => bytes32) public challengeSetOf;
    mapping(uint256 epoch => bool) public reported;
    /// @notice The least epoch a report may still be submitted for (reports go in epoch order).
    uint256 public nextReportEpoch;
    /// @notice Verifiers activated at the start of each epoch.
    mapping(uint256 epoch => uint32) public activations;
    /// @notice Expired disputes each verifier left without a vote (kept across registrations).
    mapping(address verifier => uint32) public strikesOf;
    /// @notice What one member's audit of one shard costs, as a share (bps) of the shard's
    /// budget: every sitting member re-scores every drawn shard, one forward pass over its
    /// prompts and outputs plus the sampled-output check, which benchmarks/verification_cost.py
    /// measures at 0.23 of generating them (so 2500, rounded up).
    uint16 public auditFeeBps = 2500;
    /// @notice The audit rate (bps) a client bought for its task; 0 when none was bought
    /// (members then audit it at `BASE_AUDIT_RATE_BPS`).
    mapping(uint256 taskId => uint16) public auditRateOf;
    /// @notice Audit fees owed to each member of an epoch's committee (every member audits
    /// every drawn shard, so each is owed the same).
    mapping(uint256 epoch => uint256) public auditFeePerMember;
    /// @notice Whether a member has pulled its audit fees of an epoch.
    mapping(uint256 epoch => mapping(address member => bool)) public auditFeeClaimed;

    address[] private _seats;
    mapping(address => VerifierInfo) private _verifiers;
    Checkpoints.Trace208 private _totalWeight;
    Checkpoints.Trace208 private _memberCount;

    event GPURegistrySet(address gpuRegistry);
    event EscrowSet(address escrow);
    event ArbitrationSet(address arbitration);
    event TreasurySet(address treasury);
    event MinVerifierStakeSet(uint256 v);
    event UnbondingPeriodSet(uint64 v);
    event MaxMembersSet(uint256 v);
    event MembershipParamsSet(uint64 activationDelay, uint32 churnLimit);
    event IdlePenaltySet(uint32 strikesAllowed, uint16 slashBps);
    event ChallengeAnswerWindowSet(uint64 window);
    event AuditFeeSet(uint16 feeBps);
    /// @notice `taskId`'s client bought the audit rate `rateBps`, paying `fee` wei to the
    /// committee of `epoch`.
    event AuditRateRaised(uint256 indexed taskId, uint16 rateBps, uint256 indexed epoch, uint256 fee);
    /// @notice `member` was credited its `amount` wei share of `epoch`'s audit fees.
    event AuditFeeClaimed(uint256 indexed epoch, address indexed member, uint256 amount);
    /// @notice `verifier` bonded `stake` wei and votes from epoch `activeFrom` on.
    event VerifierRegistered(address indexed verifier, uint256 stake, uint64 activeFrom);
    /// @notice A newcomer with more stake took `verifier`'s seat from epoch `activeUntil` on.
    /// A pending join displaced before it took effect (`activeUntil` is then its `activeFrom`)
    /// may withdraw its stake at once.
    event VerifierDisplaced(address indexed verifier, address indexed by, uint64 activeUntil);
    /// @notice `verifier` votes until epoch `activeUntil` and may withdraw at `withdrawableAt`.
    event VerifierExitRequested(address indexed verifier, uint64 activeUntil, uint64 withdrawableAt);
    event VerifierStakeWithdrawn(address indexed verifier, uint256 amount);
    /// @notice An absence from an expired dispute cost `verifier` its seat and `slashed` wei.
    event AbsencePenalized(address indexed verifier, uint32 strikes, uint256 slashed, address beneficiary);
    event ChallengeSetCommitted(uint256 indexed epoch, bytes32 challengeSetHash, bytes32 lastCommitHash, address[] signers);
    event ReputationSubmitted(uint256 indexed epoch, bytes32 evidenceRoot, uint256 count, address[] signers);
    /// @notice A reported miner was not registered any more; its score was not written.
    event ReputationSkipped(uint256 indexed epoch, address indexed miner);
    event Equivocation(address indexed verifier, uint256 indexed epoch, address indexed prover, uint256 slashed);

    error NotWired();
    error Unauthorized(address caller);
    /// @notice Only externally owned accounts may register (votes and reports are ECDSA-signed).
    /// @dev The check is `msg.sender == tx.origin`: an EIP-7702-delegated account passes when its
    /// own key sends the transaction. Harmless while every payout is pulled behind
    /// `nonReentrant` and signatures are plain ECDSA (EIP7702.test.js).
    error ContractAccount(address account);
    error InsufficientStake(uint256 required, uint256 got);
    error AlreadyRegistered(address verifier);
    error NotMember(address account);
    /// @notice Every seat is taken by a member with at least `lowestStake` (a newcomer must bond more).
    error CommitteeFull(uint256 max, uint256 lowestStake);
    /// @notice `limit` verifiers, each with at least as much stake, are already being
    /// activated at epoch `epoch`: bond more or try next epoch.
    error ChurnLimitReached(uint256 epoch, uint256 limit);
    error NotExiting(address verifier);
    error UnbondingNotOver(uint64 withdrawableAt);
    error InvalidMaxMembers(uint256 v);
    error InvalidMembershipParams(uint64 activationDelay, uint32 churnLimit);
    error InvalidBps(uint256 bps);
    error ZeroEpochDuration();
    /// @notice The answer window must be positive and shorter than an epoch.
    error InvalidAnswerWindow(uint64 window, uint64 epochDuration);
    error NoMembers();
    error WrongEpoch(uint256 epoch, uint256 current);
    error AlreadyCommitted(uint256 epoch);
    error ZeroChallengeSet();
    /// @notice Reports are accepted only for epochs from `next` on (epoch order).
    error ReportOutOfOrder(uint256 epoch, uint256 next);
    error LengthMismatch(uint256 miners, uint256 scores);
    /// @notice A report lists its miners strictly ascending by address (each once).
    error MinersNotSorted();
    error TooManyMiners(uint256 max, uint256 got);
    error ScoreOutOfRange(uint256 score);
    /// @notice A quorum signer is not a member of the epoch's committee.
    error NotCommitteeMember(address signer);
    /// @notice The signers hold `got` of the snapshot's weight; more than two thirds (`required`) is needed.
    error QuorumNotReached(uint256 required, uint256 got);
    error EpochMismatch(uint256 a, uint256 b);
    error SameReport();
    error SignerMismatch(address expected, address got);
    error NothingToSlash(address verifier);
    /// @notice Only the task's client may buy its audit rate.
    error NotClient(address caller);
    /// @notice The rate bought must exceed both the task's current rate and the base rate.
    error RateNotRaised(uint16 current, uint16 requested);
    /// @notice A shard of the task is claimed, submitted or disputed: its miner took it at the
    /// old rate, so the rate may only change while none is.
    error ShardsCommitted(uint256 taskId);
    /// @notice The task is cancelled, past its deadline, or has nothing left to audit.
    error TaskClosed(uint256 taskId);
    error WrongFee(uint256 expected, uint256 got);
    /// @notice An epoch's audit fees are paid once it is over (they accrue until then).
    error EpochNotOver(uint256 epoch);
    error AuditFeeAlreadyClaimed(uint256 epoch, address member);
    error NoAuditFees(uint256 epoch);

    /// @param minVerifierStake_ Least stake (wei) to register.
    /// @param unbondingPeriod_ Seconds a leaving verifier's stake stays bonded after the last
    /// dispute its seat could judge has expired (time to report its absences).
    /// @param epochDuration_ Seconds per epoch (> 0).
    /// @param genesisTime_ Start of epoch 0 (0: this block's timestamp; must not be in the future).
    constructor(uint256 minVerifierStake_, uint64 unbondingPeriod_, uint64 epochDuration_, uint64 genesisTime_)
        Ownable(msg.sender)
        EIP712("Quarry", "1")
    {
        if (epochDuration_ == 0) revert ZeroEpochDuration();
        minVerifierStake = minVerifierStake_;
        unbondingPeriod = unbondingPeriod_;
        epochDuration = epochDuration_;
        challengeAnswerWindow = epochDuration_ / 2 > 0 ? epochDuration_ / 2 : 1;
        genesisTime = genesisTime_ == 0 || genesisTime_ > block.timestamp ? uint64(block.timestamp) : genesisTime_;
    }

    // ------------------------------------------------------------------ wiring and params

    /// @notice Sets GPURegistry (receives reputation). One-time, owner only.
    function setGPURegistry(address a) external onlyOwner setOnce(address(gpuRegistry), a) {
        gpuRegistry = IGPURegistry(a);
        emit GPURegistrySet(a);
    }

    /// @notice Sets PaymentEscrow (receives slashed stake). One-time, owner only.
    function setEscrow(address a) external onlyOwner setOnce(address(escrow), a) {
        escrow = IPaymentEscrow(a);
        emit EscrowSet(a);
    }

    /// @notice Sets Arbitration (penalizes absent members). One-time, owner only.
    function setArbitration(address a) external onlyOwner setOnce(arbitration, a) {
        arbitration = a;
        emit ArbitrationSet(a);
    }

    /// @notice Sets the treasury that gets the non-prover half of equivocation slashes.
    function setTreasury(address a) external onlyOwner {
        if (a == address(0)) revert ZeroAddress();
        treasury = a;
        emit TreasurySet(a);
    }

    /// @notice Sets the least verifier stake for new registrations.
    function setMinVerifierStake(uint256 v) external onlyOwner {
        minVerifierStake = v;
        emit MinVerifierStakeSet(v);
    }

    /// @notice Sets the unbonding period in seconds (for exits requested afterwards).
    function setUnbondingPeriod(uint64 v) external onlyOwner {
        unbondingPeriod = v;
        emit UnbondingPeriodSet(v);
    }

    /// @notice Sets the most members of one epoch (1..MAX_MEMBERS_CAP). Lowering it removes no
    /// one: newcomers then displace the smallest stakes one for one.
    function setMaxMembers(uint256 v) external onlyOwner {
        if (v == 0 || v > MAX_MEMBERS_CAP) revert InvalidMaxMembers(v);
        maxMembers = v;
        emit MaxMembersSet(v);
    }

    /// @notice Sets the activation delay (epochs, >= 1) and the churn limit (>= 1).
    function setMembershipParams(uint64 activationDelay_, uint32 churnLimit_) external onlyOwner {
        if (activationDelay_ == 0 || churnLimit_ == 0) revert InvalidMembershipParams(activationDelay_, churnLimit_);
        activationDelay = activationDelay_;
        churnLimit = churnLimit_;
        emit MembershipParamsSet(activationDelay_, churnLimit_);
    }

    /// @notice Sets how long a challenged miner has to answer before the committee may report
    /// the challenge missed (seconds, > 0 and < `epochDuration`).
    function setChallengeAnswerWindow(uint64 window) external onlyOwner {
        if (window == 0 || window >= epochDuration) revert InvalidAnswerWindow(window, epochDuration);
        challengeAnswerWindow = window;
        emit ChallengeAnswerWindowSet(window);
    }

    /// @notice Sets how absences from expired disputes are punished.
    function setIdlePenalty(uint32 strikesAllowed, uint16 slashBps) external onlyOwner {
        if (slashBps > BPS) revert InvalidBps(slashBps);
        idleStrikesAllowed = strikesAllowed;
        idleSlashBps = slashBps;
        emit IdlePenaltySet(strikesAllowed, slashBps);
    }

    /// @notice Sets what one member's audit of one shard costs, in bps of its budget (<= 10000);
    /// applies to rates bought afterwards.
    function setAuditFee(uint16 feeBps) external onlyOwner {
        if (feeBps > BPS) revert InvalidBps(feeBps);
        auditFeeBps = feeBps;
        emit AuditFeeSet(feeBps);
    }

    // ------------------------------------------------------------------ paid audit rates

    /// @notice Raises the audit rate of the caller's task to `rateBps`, paying {auditFee} for the
    /// extra audits to the current epoch's committee. Client only, while none of its shards is
    /// claimed, submitted or disputed (send it right after createTask; once a miner claims, it
    /// reverts {ShardsCommitted} and costs nothing). Members read the rate at each shard's
    /// submission (verifier/audits.py `audit_rate`).
    /// @dev Not a way to grief a miner: an audit of an honest shard passes and costs its miner
    /// nothing (no dispute, no delay of its payment); only a failing one is disputed.
    /// @param taskId The task.
    /// @param rateBps The share of its shards to audit (bps, above the current and base rates).
    function raiseAuditRate(uint256 taskId, uint16 rateBps) external payable nonReentrant {
        (uint256 perMember, uint256 fee) = _auditFee(taskId, rateBps, msg.sender);
        if (msg.value != fee) revert WrongFee(fee, msg.value);
        uint256 epoch = currentEpoch();
        auditRateOf[taskId] = rateBps;
        auditFeePerMember[epoch] += perMember;
        emit AuditRateRaised(taskId, rateBps, epoch, fee);
    }

    /// @notice The wei {raiseAuditRate} takes to raise `taskId` to `rateBps` now: for each
    /// member of the current committee, `auditFeeBps` of the budget still open times the rate
    /// added (above the task's rate and the base rate). Reverts where {raiseAuditRate} would.
    function auditFee(uint256 taskId, uint16 rateBps) external view returns (uint256 fee) {
        (, fee) = _auditFee(taskId, rateBps, address(0));
    }

    /// @notice Credits the caller (in PaymentEscrow, pull) its share of the audit fees paid to
    /// `epoch`'s committee, once that epoch is over. Each member of the epoch gets the same.
    /// A member claims before its stake is withdrawn (a new registration forgets the old seat).
    function claimAuditFees(uint256 epoch) external nonReentrant {
        if (address(escrow) == address(0)) revert NotWired();
        if (epoch >= currentEpoch()) revert EpochNotOver(epoch);
        VerifierInfo storage v = _verifiers[msg.sender];
        if (v.activeFrom == 0 || epoch < v.activeFrom || epoch >= v.activeUntil) revert NotCommitteeMember(msg.sender);
        if (auditFeeClaimed[epoch][msg.sender]) revert AuditFeeAlreadyClaimed(epoch, msg.sender);
        uint256 amount = auditFeePerMember[epoch];
        if (amount == 0) revert NoAuditFees(epoch);
        auditFeeClaimed[epoch][msg.sender] = true;
        emit AuditFeeClaimed(epoch, msg.sender, amount);
        escrow.credit{value: amount}(msg.sender);
    }

    // ------------------------------------------------------------------ membership

    /// @notice Bonds `msg.value` as stake and takes a seat from the next possible epoch
    /// boundary (`currentEpoch() + activationDelay`). Externally owned accounts only.
    /// @dev When that boundary already activates `churnLimit` verifiers, the pending join with
    /// the least stake there is displaced if `msg.value` is strictly more, else this reverts
    /// {ChurnLimitReached}: slots go by stake, so a squatter keeps out only smaller joins, and
    /// keeping a join of stake S out costs `churnLimit` bonds of more than S (seated at the
    /// boundary, or locked for `unbondingPeriod` if cancelled). Then, with every seat taken,
    /// the member with the least stake is displaced at the same boundary, or this reverts
    /// {CommitteeFull} when every seat holds at least as much stake. A displaced join that had
    /// not taken effect judged nothing and did nothing wrong, so its stake is free at once.
    /// Emits {VerifierRegistered} (and {VerifierDisplaced}).
    function register() external payable {
        // solhint-disable-next-line avoid-tx-origin
        if (msg.sender != tx.origin) revert ContractAccount(msg.sender);
        VerifierInfo storage v = _verifiers[msg.sender];
        if (v.activeFrom != 0) revert AlreadyRegistered(msg.sender);
        if (msg.value == 0 || msg.value < minVerifierStake) revert InsufficientStake(minVerifierStake, msg.value);
        uint48 at = _changeEpoch();
        _prune();
        if (activations[at] >= churnLimit) {
            (address smallest, uint256 smallestWeight) = _lowestSeat(at);
            if (smallest == address(0) || msg.value <= smallestWeight) revert ChurnLimitReached(at, churnLimit);
            _displace(smallest, at);
        }
        if (_memberCount.latest() >= maxMembers) {
            (address lowest, uint256 lowestWeight) = _lowestSeat(0);
            if (msg.value <= lowestWeight) revert CommitteeFull(maxMembers, lowestWeight);
            _displace(lowest, at);
        }
        if (_seats.length >= MAX_SEATS) revert CommitteeFull(maxMembers, 0);
        activations[at] += 1;
        v.stake = msg.value;
        v.weight = msg.value;
        v.activeFrom = at;
        v.activeUntil = type(uint64).max;
        _seats.push(msg.sender);
        _moveWeight(at, msg.value, true);
        emit VerifierRegistered(msg.sender, msg.value, at);
    }

    /// @notice Leaves the committee at the next possible epoch boundary; the stake can be
    /// withdrawn once disputes opened before that boundary have expired, plus
    /// `unbondingPeriod`. A join that would take effect at that same boundary never takes
    /// effect: its seat and activation slot are given back at once, and its stake unbonds for
    /// `unbondingPeriod` from now, so holding slots or displacing members is never free.
    /// Emits {VerifierExitRequested}.
    function requestExit() external {
        VerifierInfo storage v = _verifiers[msg.sender];
        if (v.activeFrom == 0 || v.activeUntil != type(uint64).max) revert NotMember(msg.sender);
        uint48 at = _changeEpoch();
        _unseat(msg.sender, at);
        emit VerifierExitRequested(msg.sender, at, v.withdrawableAt);
    }

    /// @notice Sends the caller its stake after the unbonding period and clears its record.
    /// @dev The bound is recomputed with the current dispute timeout and unbonding period, and
    /// the later of it and the recorded one applies: raising either never lets a member leave
    /// before the disputes its seat judged have expired.
    function withdrawStake() external nonReentrant {
        VerifierInfo storage v = _verifiers[msg.sender];
        if (v.withdrawableAt == 0) revert NotExiting(msg.sender);
        uint64 at = v.withdrawableAt;
        if (v.activeFrom < v.activeUntil) {
            uint64 bound = _unbondsAt(v.activeUntil); // it sat: its disputes bind it
            if (bound > at) at = bound;
        }
        if (block.timestamp < at) revert UnbondingNotOver(at);
        uint256 amount = v.stake;
        delete _verifiers[msg.sender];
        emit VerifierStakeWithdrawn(msg.sender, amount);
        if (amount > 0) Address.sendValue(payable(msg.sender), amount);
    }

    /// @notice Penalizes `verifier` for an expired dispute it did not vote on: a strike, its
    /// seat (from the next possible boundary), and past `idleStrikesAllowed` strikes
    /// `idleSlashBps` of its stake, credited to `beneficiary`. Arbitration only.
    /// @return slashed The wei taken.
    function penalizeAbsence(address verifier, address beneficiary)
        external
        nonReentrant
        returns (uint256 slashed)
    {
        if (msg.sender != arbitration || msg.sender == address(0)) revert Unauthorized(msg.sender);
        VerifierInfo storage v = _verifiers[verifier];
        uint32 strikes = ++strikesOf[verifier];
        if (v.activeFrom != 0 && v.activeUntil == type(uint64).max) _unseat(verifier, _changeEpoch());
        if (strikes > idleStrikesAllowed) {
            slashed = v.stake * idleSlashBps / BPS;
            v.stake -= slashed;
        }
        emit AbsencePenalized(verifier, strikes, slashed, beneficiary);
        if (slashed > 0) escrow.credit{value: slashed}(beneficiary);
    }

    // ------------------------------------------------------------------ epochs

    /// @notice Commits the challenge set of `epoch` (must be `currentEpoch() + 1`) with a quorum
    /// of the current snapshot's sorted member signatures over `ChallengeSet(epoch,
    /// challengeSetHash)`. Once per epoch.
    /// @param epoch The epoch the challenges run in.
    /// @param challengeSetHash Hash of the off-chain challenge set (non-zero).
    /// @param sigs Member signatures, signers strictly ascending by address.
    function commitChallengeSet(uint256 epoch, bytes32 challengeSetHash, bytes[] calldata sigs) external {
        uint256 cur = currentEpoch();
        if (epoch != cur + 1) revert WrongEpoch(epoch, cur);
        if (challengeSetHash == bytes32(0)) revert ZeroChallengeSet();
        if (challengeSetOf[epoch] != bytes32(0)) revert AlreadyCommitted(epoch);
        address[] memory signers = _checkQuorum(hashChallengeSet(epoch, challengeSetHash), sigs, cur);
        challengeSetOf[epoch] = challengeSetHash;
        bytes32 h = keccak256(abi.encode(lastCommitHash, epoch, challengeSetHash));
        lastCommitHash = h;
        emit ChallengeSetCommitted(epoch, challengeSetHash, h, signers);
    }

    /// @notice Writes a reputation report for `epoch`, signed by a quorum of that epoch's
    /// committee, to GPURegistry. `epoch` must not be in the future and must be newer than
    /// every epoch reported before (a held-back older report can never overwrite a newer one).
    /// Miners no longer registered are skipped; a miner scored `MISSED` keeps its reputation
    /// and has the miss recorded (GPURegistry.recordMissed).
    /// @param epoch The epoch scored.
    /// @param miners Miners scored (<= 256), strictly ascending by address.
    /// @param scoresBps Their new reputations (<= 10000 each), or `MISSED`.
    /// @param evidenceRoot Root of the off-chain evidence.
    /// @param sigs Member signatures over the Report, signers strictly ascending by address.
    function submitReputation(
        uint256 epoch,
        address[] calldata miners,
        uint16[] calldata scoresBps,
        bytes32 evidenceRoot,
        bytes[] calldata sigs
    ) external {
        if (address(gpuRegistry) == address(0)) revert NotWired();
        uint256 cur = currentEpoch();
        if (epoch > cur) revert WrongEpoch(epoch, cur);
        if (epoch < nextReportEpoch) revert ReportOutOfOrder(epoch, nextReportEpoch);
        if (miners.length != scoresBps.length) revert LengthMismatch(miners.length, scoresBps.length);
        if (miners.length > MAX_REPORT_MINERS) revert TooManyMiners(MAX_REPORT_MINERS, miners.length);
        for (uint256 i = 0; i < scoresBps.length; ++i) {
            if (scoresBps[i] > BPS && scoresBps[i] != MISSED) revert ScoreOutOfRange(scoresBps[i]);
            if (i > 0 && miners[i] <= miners[i - 1]) revert MinersNotSorted();
        }
        address[] memory signers = _checkQuorum(_hashReport(epoch, miners, scoresBps, evidenceRoot), sigs, epoch);
        reported[epoch] = true;
        nextReportEpoch = epoch + 1;
        emit ReputationSubmitted(epoch, evidenceRoot, miners.length, signers);
        uint256 start = epochStart(epoch);
        for (uint256 i = 0; i < miners.length; ++i) {
            if (!gpuRegistry.isRegistered(miners[i])) {
                emit ReputationSkipped(epoch, miners[i]);
            } else if (scoresBps[i] == MISSED) {
                gpuRegistry.recordMissed(miners[i]);
            } else {
                gpuRegistry.setReputation(miners[i], scoresBps[i], start);
            }
        }
    }

    /// @notice Slashes `verifier` for signing two different reports of the same epoch: its
    /// whole stake, half credited to the caller and the rest to the treasury; it loses its seat
    /// at the next possible boundary. Anyone may call.
    function proveEquivocation(
        address verifier,
        Report calldata a,
        bytes calldata sigA,
        Report calldata b,
        bytes calldata sigB
    ) external nonReentrant {
        if (address(escrow) == address(0)) revert NotWired();
        if (a.epoch != b.epoch) revert EpochMismatch(a.epoch, b.epoch);
        bytes32 ha = hashReport(a);
        bytes32 hb = hashReport(b);
        if (ha == hb) revert SameReport();
        address sa = SigLib.recover(ha, sigA);
        if (sa != verifier) revert SignerMismatch(verifier, sa);
        address sb = SigLib.recover(hb, sigB);
        if (sb != verifier) revert SignerMismatch(verifier, sb);
        VerifierInfo storage v = _verifiers[verifier];
        uint256 amount = v.stake;
        if (amount == 0) revert NothingToSlash(verifier);
        v.stake = 0;
        if (v.activeUntil == type(uint64).max) _unseat(verifier, _changeEpoch());
        uint256 toProver = amount / 2;
        emit Equivocation(verifier, a.epoch, msg.sender, amount);
        escrow.credit{value: toProver}(msg.sender);
        escrow.credit{value: amount - toProver}(treasury == address(0) ? owner() : treasury);
    }

    // ------------------------------------------------------------------ views

    /// @notice `verifier`'s voting weight in `epoch`'s committee (0 when not a member then).
    function weightAt(address verifier, uint256 epoch) public view returns (uint256) {
        VerifierInfo storage v = _verifiers[verifier];
        if (v.activeFrom == 0 || epoch < v.activeFrom || epoch >= v.activeUntil) return 0;
        return v.weight < v.stake ? v.weight : v.stake;
    }

    /// @notice The total weight of `epoch`'s committee.
    function totalWeightAt(uint256 epoch) public view returns (uint256) {
        return _totalWeight.upperLookupRecent(SafeCast.toUint48(epoch));
    }

    /// @notice The number of members of `epoch`'s committee.
    function memberCountAt(uint256 epoch) public view returns (uint256) {
        return _memberCount.upperLookupRecent(SafeCast.toUint48(epoch));
    }

    /// @notice The least signer weight that is a quorum in `epoch`: more than 2/3 of its total.
    function quorumWeight(uint256 epoch) public view returns (uint256) {
        return totalWeightAt(epoch) * 2 / 3 + 1;
    }

    /// @notice True when `account` is a member of the current epoch's committee.
    function isMember(address account) external view returns (bool) {
        return weightAt(account, currentEpoch()) > 0;
    }

    /// @notice The members of `epoch`'s committee, ascending by address. Exact for the current
    /// and later epochs; for earlier ones, verifiers who have since left may be missing.
    function membersAt(uint256 epoch) public view returns (address[] memory out) {
        address[] memory found = new address[](_seats.length);
        uint256 n = 0;
        for (uint256 i = 0; i < _seats.length; ++i) {
            address a = _seats[i];
            if (weightAt(a, epoch) == 0) continue;
            uint256 j = n++;
            while (j > 0 && found[j - 1] > a) {
                found[j] = found[j - 1];
                --j;
            }
            found[j] = a;
        }
        out = new address[](n);
        for (uint256 i = 0; i < n; ++i) {
            out[i] = found[i];
        }
    }

    /// @notice The current epoch's committee, ascending by address.
    function members() external view returns (address[] memory) {
        return membersAt(currentEpoch());
    }

    /// @notice Every verifier holding a seat or leaving one (unordered; at most MAX_SEATS).
    function seats() external view returns (address[] memory) {
        return _seats;
    }

    /// @notice A verifier's stake, weight and activity span.
    function verifierInfo(address account) external view returns (VerifierInfo memory) {
        return _verifiers[account];
    }

    /// @notice `(block.timestamp - genesisTime) / epochDuration`.
    function currentEpoch() public view returns (uint256) {
        return (block.timestamp - genesisTime) / epochDuration;
    }

    /// @notice When `epoch` starts.
    function epochStart(uint256 epoch) public view returns (uint256) {
        return genesisTime + epoch * epochDuration;
    }

    /// @notice `membersAt(epoch)[uint256(keccak256(abi.encode(lastCommitHash, epoch))) % n]`.
    function leaderOf(uint256 epoch) external view returns (address) {
        address[] memory m = membersAt(epoch);
        if (m.length == 0) revert NoMembers();
        return m[uint256(keccak256(abi.encode(lastCommitHash, epoch))) % m.length];
    }

    /// @notice EIP-712 digest of `ChallengeSet(epoch, challengeSetHash)` in this domain.
    function hashChallengeSet(uint256 epoch, bytes32 challengeSetHash) public view returns (bytes32) {
        return _hashTypedDataV4(keccak256(abi.encode(CHALLENGE_SET_TYPEHASH, epoch, challengeSetHash)));
    }

    /// @notice EIP-712 digest of a Report in this domain.
    function hashReport(Report calldata r) public view returns (bytes32) {
        return _hashReport(r.epoch, r.miners, r.scoresBps, r.evidenceRoot);
    }

    /// @notice This contract's EIP-712 domain separator.
    function domainSeparator() external view returns (bytes32) {
        return _domainSeparatorV4();
    }

    // ------------------------------------------------------------------ internal

    /// @dev The fee for raising `taskId` to `rateBps`, per member and in all; `client` is
    /// checked against the task's unless zero. With no shard committed, the escrow holds
    /// exactly the budgets of the Open shards, the ones still to be audited.
    function _auditFee(uint256 taskId, uint16 rateBps, address client)
        private
        view
        returns (uint256 perMember, uint256 fee)
    {
        if (address(gpuRegistry) == address(0) || address(escrow) == address(0)) revert NotWired();
        Task memory t = ITaskRegistry(gpuRegistry.taskRegistry()).getTask(taskId);
        if (client != address(0) && client != t.client) revert NotClient(client);
        if (rateBps > BPS) revert InvalidBps(rateBps);
        uint16 floor = auditRateOf[taskId] > BASE_AUDIT_RATE_BPS ? auditRateOf[taskId] : BASE_AUDIT_RATE_BPS;
        if (rateBps <= floor) revert RateNotRaised(floor, rateBps);
        if (t.cancelled || block.timestamp >= t.deadline) revert TaskClosed(taskId);
        if (t.committed != 0) revert ShardsCommitted(taskId);
        uint256 open = escrow.escrowed(taskId);
        if (open == 0) revert TaskClosed(taskId);
        uint256 seated = memberCountAt(currentEpoch());
        if (seated == 0) revert NoMembers();
        perMember = open * (rateBps - floor) * auditFeeBps / (uint256(BPS) * BPS);
        fee = perMember * seated;
    }

    function _hashReport(uint256 epoch, address[] calldata miners, uint16[] calldata scores, bytes32 evidenceRoot)
        private
        view
        returns (bytes32)
    {
        return _hashTypedDataV4(
            keccak256(
                abi.encode(
                    REPORT_TYPEHASH,
                    epoch,
                    keccak256(abi.encodePacked(miners)),
                    keccak256(abi.encodePacked(scores)),
                    evidenceRoot
                )
            )
        );
    }

    /// @dev Recovers `sigs` (strictly ascending signers), each a member of `epoch`'s committee,
    /// and checks that together they weigh more than two thirds of it.
    function _checkQuorum(bytes32 digest, bytes[] calldata sigs, uint256 epoch)
        private
        view
        returns (address[] memory signers)
    {
        signers = SigLib.recoverSorted(digest, sigs);
        uint256 weight = 0;
        for (uint256 i = 0; i < signers.length; ++i) {
            uint256 w = weightAt(signers[i], epoch);
            if (w == 0) revert NotCommitteeMember(signers[i]);
            weight += w;
        }
        uint256 required = quorumWeight(epoch);
        if (weight < required) revert QuorumNotReached(required, weight);
    }

    /// @dev The epoch at which a membership change requested now takes effect. Never earlier
    /// than a change already scheduled, so the weight checkpoints stay in key order even after
    /// the activation delay is lowered.
    function _changeEpoch() private view returns (uint48) {
        uint256 at = currentEpoch() + activationDelay;
        (bool exists, uint48 last,) = _totalWeight.latestCheckpoint();
        if (exists && last > at) at = last;
        return SafeCast.toUint48(at);
    }

    /// @dev Adds (or removes) `weight` and one member to every epoch from `at` on.
    function _moveWeight(uint48 at, uint256 weight, bool add) private {
        uint256 total = _totalWeight.latest();
        uint256 count = _memberCount.latest();
        _totalWeight.push(at, SafeCast.toUint208(add ? total + weight : total - weight));
        _memberCount.push(at, SafeCast.toUint208(add ? count + 1 : count - 1));
    }

    /// @dev Ends `account`'s membership at epoch `at`. Its stake stays bonded until the last
    /// dispute opened before `at` has expired, plus the unbonding period. A join that never
    /// takes effect (activeFrom == at) judged nothing: it leaves the seat list and gives its
    /// activation slot back at once, and its stake unbonds for `unbondingPeriod` from now.
    function _unseat(address account, uint48 at) private {
        VerifierInfo storage v = _verifiers[account];
        v.activeUntil = at;
        if (v.activeFrom == at) {
            activations[at] -= 1;
            _removeSeat(account);
            v.withdrawableAt = SafeCast.toUint64(block.timestamp + unbondingPeriod);
        } else {
            v.withdrawableAt = _unbondsAt(at);
        }
        _moveWeight(at, v.weight, false);
    }

    /// @dev When the stake of a seat ending at epoch `at` may leave: the end of the last dispute
    /// opened while it sat (Arbitration's timeout after the boundary), plus the unbonding period.
    function _unbondsAt(uint256 at) private view returns (uint64) {
        uint256 disputeTimeout = arbitration == address(0) ? 0 : IArbitration(arbitration).disputeTimeout();
        return SafeCast.toUint64(epochStart(at) + disputeTimeout + unbondingPeriod);
    }

    /// @dev Ends `account`'s membership at `at` in favour of the caller, a newcomer with more
    /// stake. A join that had not taken effect is released at once: unlike a cancelled one
    /// (locked for `unbondingPeriod`), it chose nothing, so displacing it must cost it nothing.
    function _displace(address account, uint48 at) private {
        _unseat(account, at);
        VerifierInfo storage v = _verifiers[account];
        if (v.activeFrom == at) v.withdrawableAt = SafeCast.toUint64(block.timestamp);
        emit VerifierDisplaced(account, msg.sender, at);
    }

    /// @dev Removes `account` from the seat list (order is not kept).
    function _removeSeat(address account) private {
        uint256 n = _seats.length;
        for (uint256 i = 0; i < n; ++i) {
            if (_seats[i] == account) {
                _seats[i] = _seats[n - 1];
                _seats.pop();
                return;
            }
        }
    }

    /// @dev The seated verifier (not leaving) with the least weight, among those activated at
    /// `from` only unless it is 0; among equals the one activated last, then the highest
    /// address (independent of the seats' order). `lowest` is zero when none qualifies.
    function _lowestSeat(uint48 from) private view returns (address lowest, uint256 lowestWeight) {
        lowestWeight = type(uint256).max;
        uint64 lowestFrom = 0;
        for (uint256 i = 0; i < _seats.length; ++i) {
            address a = _seats[i];
            VerifierInfo storage v = _verifiers[a];
            if (v.activeUntil != type(uint64).max || (from != 0 && v.activeFrom != from)) continue;
            if (
                v.weight < lowestWeight
                    || (v.weight == lowestWeight && (v.activeFrom > lowestFrom || (v.activeFrom == lowestFrom && a > lowest)))
            ) {
                lowest = a;
                lowestWeight = v.weight;
                lowestFrom = v.activeFrom;
            }
        }
    }

    /// @dev Drops the seats of verifiers whose membership has ended.
    function _prune() private {
        uint256 cur = currentEpoch();
        uint256 i = 0;
        while (i < _seats.length) {
            if (_verifiers[_seats[i]].activeUntil <= cur) {
                _seats[i] = _seats[_seats.length - 1];
                _seats.pop();
            } else {
                ++i;
            }
        }
    }
}
